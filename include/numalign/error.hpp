// numalign/error.hpp: the one error type of the library, carrying where and what.
#pragma once

#include <stdexcept>
#include <string>

#include "numalign/text.hpp"

namespace numalign {

// Exit codes shared by the CLI and every front end.
enum ExitCode : int { kAligned = 0, kNotAligned = 1, kCouldNotJudge = 2 };

// An input could not be used: `where` names the file (or the argument, or the tensor),
// `problem` says what is wrong with it. what() is "<where>: <problem>", printable: paths and
// names in it may hold anything, and the message reaches terminals.
class Error : public std::runtime_error {
 public:
  Error(std::string where, std::string problem)
      : std::runtime_error(where.empty() ? printable(problem)
                                         : printable(where) + ": " + printable(problem)),
        where_(std::move(where)),
        problem_(std::move(problem)) {}
  const std::string& where() const noexcept { return where_; }
  const std::string& problem() const noexcept { return problem_; }

 private:
  std::string where_;
  std::string problem_;
};

[[noreturn]] inline void fail(std::string where, std::string problem) {
  throw Error(std::move(where), std::move(problem));
}

}  // namespace numalign
