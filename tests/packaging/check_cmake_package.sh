#!/usr/bin/env bash
# check_cmake_package.sh BUILD: the C++ package as a downstream project sees it. Installs the
# configured and built tree BUILD into a temporary prefix, then checks that
#   - every installed header compiles alone with only the prefix's include folder;
#   - README's "From C++ tests" shows the example's code as it is;
#   - examples/cpp_kernel_test, a separate CMake project, finds the package (find_package),
#     builds with warnings as errors and passes its tests;
#   - pkg-config's flags compile and link a program;
#   - add_subdirectory() of this repository configures with our tests and benchmarks off and
#     gives the target numalign::numalign.
set -euo pipefail
build=$(realpath "${1:?usage: check_cmake_package.sh BUILD}")
root=$(realpath "$(dirname "$0")/../..")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
jobs=${JOBS:-2}

echo "== cmake --install into a temporary prefix"
cmake --install "$build" --prefix "$prefix" >/dev/null
test -f "$prefix/lib/cmake/numalign/numalignConfig.cmake"
test -f "$prefix/lib/cmake/numalign/numalignConfigVersion.cmake"
test -f "$prefix/lib/pkgconfig/numalign.pc"
"$prefix/bin/numalign" --version >/dev/null  # a shared core: found beside it (RPATH)

echo "== each installed header compiles alone"
mkdir "$work/headers"
for header in "$prefix"/include/numalign/*.hpp; do
  printf '#include <numalign/%s>\n' "${header##*/}" >"$work/headers/${header##*/}.cpp"
done
ls "$work"/headers/*.cpp | xargs -P "$jobs" -I{} \
  c++ -std=c++20 -Wall -Wextra -Wpedantic -Werror -fsyntax-only -I "$prefix/include" {}

echo "== the README's C++ and CMake code is the example's"
python3 "$root/tests/packaging/readme_matches_example.py" "$root"

echo "== examples/cpp_kernel_test against the installed package"
cmake -S "$root/examples/cpp_kernel_test" -B "$work/example" -G Ninja \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_PREFIX_PATH=$prefix" >/dev/null
cmake --build "$work/example" -j "$jobs"
"$work/example/fused_allreduce_test" --gtest_brief=1

echo "== pkg-config"
cat >"$work/pc.cpp" <<'EOF'
#include <numalign/dtype.hpp>
int main() { return numalign::name(numalign::DType::BF16) == "BF16" ? 0 : 1; }
EOF
flags=$(PKG_CONFIG_PATH=$prefix/lib/pkgconfig pkg-config --cflags --libs numalign)
# shellcheck disable=SC2086  # the flags are words
c++ -std=c++20 "$work/pc.cpp" -o "$work/pc" $flags
LD_LIBRARY_PATH=$prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$work/pc"  # a shared core

echo "== add_subdirectory: ours off, numalign::numalign on"
mkdir -p "$work/parent"
cat >"$work/parent/CMakeLists.txt" <<EOF
cmake_minimum_required(VERSION 3.20)
project(parent LANGUAGES CXX)
add_subdirectory("$root" numalign)
foreach(ours numalign_tests kernel_bench read_limit _core)
  if(TARGET \${ours})
    message(FATAL_ERROR "add_subdirectory built our \${ours}")
  endif()
endforeach()
add_executable(pc "$work/pc.cpp")
target_link_libraries(pc PRIVATE numalign::numalign)
EOF
cmake -S "$work/parent" -B "$work/parent/build" -G Ninja >/dev/null
echo "the installed package works downstream"
