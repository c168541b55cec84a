// map.cpp: map files between two implementations, and the pairing they define.
#include "numalign/map.hpp"

#include <simdjson.h>

#include <algorithm>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include "format.hpp"
#include "json_keys.hpp"
#include "numalign/consistency.hpp"
#include "numalign/error.hpp"
#include "numalign/glob.hpp"
#include "numalign/layout.hpp"
#include "numalign/rules.hpp"
#include "numalign/trace.hpp"
#include "regular_file.hpp"

namespace numalign {

namespace {

std::string in_quotes(std::string_view s) { return "\"" + std::string(s) + "\""; }

// The capture numbers a template inserts ({1} -> 1), in order; throws on a brace that does
// not open a placeholder.
std::vector<std::size_t> placeholders(const std::string& text, const std::string& where) {
  std::vector<std::size_t> found;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '{') continue;
    std::size_t j = i + 1, n = 0;
    while (j < text.size() && j - i <= 4 && text[j] >= '0' && text[j] <= '9')
      n = n * 10 + static_cast<std::size_t>(text[j++] - '0');
    if (j == i + 1 || j >= text.size() || text[j] != '}' || n == 0) {
      fail(where, in_quotes(text) + ": a placeholder is {N}, N >= 1 the number of a * of the glob");
    }
    found.push_back(n);
    i = j;
  }
  return found;
}

std::size_t count_stars(std::string_view glob) {
  return static_cast<std::size_t>(std::count(glob.begin(), glob.end(), '*'));
}

// Reads "test" or "ref": a name or glob, or a non-empty list of names.
void read_side(simdjson::dom::element value, const std::string& where, const char* side,
               std::vector<std::string>& out, bool& is_list) {
  std::string_view one;
  simdjson::dom::array list;
  if (!value.get(one)) {
    out.emplace_back(one);
  } else if (!value.get(list)) {
    is_list = true;
    for (auto item : list) {
      if (item.get(one)) fail(where, std::string(side) + " must be a string or a list of strings");
      out.emplace_back(one);
    }
    if (out.empty()) fail(where, std::string(side) + " is an empty list");
  } else {
    fail(where, std::string(side) + " must be a string or a list of strings");
  }
  for (const auto& s : out)
    if (s.empty()) fail(where, std::string(side) + " holds an empty name");
}

std::int64_t read_int(simdjson::dom::element value, const std::string& where, const char* what) {
  std::int64_t v;
  if (value.get(v) || v < -64 || v > 64)
    fail(where, std::string(what) + " must be a dim (an integer)");
  return v;
}

MapEntry parse_entry(simdjson::dom::element item, std::size_t number, const std::string& origin) {
  const std::string where = "map entry " + std::to_string(number);
  simdjson::dom::object obj;
  if (item.get(obj)) fail(origin, where + " must be an object");
  detail::refuse_repeated_keys(obj, origin, where);
  MapEntry e;
  e.number = number;
  for (auto f : obj) {
    const std::string k(f.key);
    const std::string at = where;
    try {
      if (k == "test") {
        read_side(f.value, where, "test", e.test, e.test_is_list);
      } else if (k == "ref") {
        read_side(f.value, where, "ref", e.ref, e.ref_is_list);
      } else if (k == "cat_dim") {
        e.cat_dim = read_int(f.value, where, "cat_dim");
      } else if (k == "transpose") {
        simdjson::dom::array dims;
        std::vector<std::int64_t> got;
        if (!f.value.get(dims))
          for (auto d : dims) got.push_back(read_int(d, where, "transpose"));
        if (got.size() != 2 || got[0] == got[1])
          fail(where, "transpose must be two different dims, as [0, 1]");
        e.transpose = std::array<std::int64_t, 2>{got[0], got[1]};
      } else if (k == "sharded_dim") {
        e.sharded_dim = read_int(f.value, where, "sharded_dim");
      } else if (k == "replicated") {
        if (f.value.get(e.replicated)) fail(where, "replicated must be true or false");
      } else {
        fail(where, "unknown field \"" + k +
                        "\" (expected test, ref, cat_dim, transpose, sharded_dim, replicated)");
      }
    } catch (const Error& err) {
      fail(origin, err.where() + ": " + err.problem());
    }
  }
  auto stop = [&](const std::string& problem) { fail(origin, where + ": " + problem); };
  if (e.ref.empty()) stop("needs \"ref\"");
  if (e.sharded_dim && e.replicated) stop("sharded_dim and replicated exclude each other");
  if ((e.sharded_dim || e.replicated) && (e.test_is_list || e.ref_is_list))
    stop("sharded_dim and replicated take one test and one ref tensor per match, not a list");
  if (e.test.empty()) {  // the same names on both sides: ref is the glob
    if (e.ref_is_list) stop("needs \"test\" when ref is a list");
    if (!placeholders(e.ref.front(), origin + ": " + where + ": ref").empty())
      stop("ref inserts captures, but there is no test glob to capture them");
    if (e.ref.front().find("**") != std::string::npos)
      stop("ref glob " + in_quotes(e.ref.front()) +
           " has two * side by side: what each captures would be ambiguous");
    e.test_named_as_ref = true;
    e.glob_on_test = false;
    return e;
  }
  if (e.test_is_list && e.ref_is_list)
    stop("test and ref are both lists: one side must be one name or glob");
  if ((e.test_is_list || e.ref_is_list) && !e.cat_dim)
    stop(std::string("a list of ") + (e.ref_is_list ? "ref" : "test") +
         " tensors needs \"cat_dim\", the dim they lie side by side along");
  if (!e.test_is_list && !e.ref_is_list && e.cat_dim)
    stop("cat_dim needs a list of test or ref tensors to concatenate");
  // The side that inserts captures is the template side; the other is matched as a glob.
  auto inserts = [&](const std::vector<std::string>& side, const char* name) {
    bool any = false;
    for (const auto& s : side)
      any = !placeholders(s, origin + ": " + where + ": " + name).empty() || any;
    return any;
  };
  const bool test_inserts = inserts(e.test, "test"), ref_inserts = inserts(e.ref, "ref");
  if (test_inserts && ref_inserts)
    stop("test and ref both insert captures ({N}): one side must be the glob");
  e.glob_on_test = ref_inserts || (!test_inserts && !e.test_is_list);
  const std::vector<std::string>& glob_side = e.glob_on_test ? e.test : e.ref;
  const std::vector<std::string>& template_side = e.glob_on_test ? e.ref : e.test;
  const char* glob_name = e.glob_on_test ? "test" : "ref";
  const char* template_name = e.glob_on_test ? "ref" : "test";
  if (glob_side.size() != 1 || (e.glob_on_test ? e.test_is_list : e.ref_is_list))
    stop(std::string(glob_name) + " must be one name or glob when " + template_name +
         " inserts its captures");
  const std::string& glob = glob_side.front();
  if (glob.find("**") != std::string::npos)
    stop(std::string(glob_name) + " glob " + in_quotes(glob) +
         " has two * side by side: what each captures would be ambiguous");
  const std::size_t stars = count_stars(glob);
  bool any_insert = false;
  for (const auto& t : template_side) {
    for (std::size_t n : placeholders(t, origin)) {
      any_insert = true;
      if (n > stars)
        stop(std::string(template_name) + " " + in_quotes(t) + " inserts capture {" +
             std::to_string(n) + "}, but " + glob_name + " glob " + in_quotes(glob) + " has " +
             (stars == 0 ? "no *" : "only " + std::to_string(stars) + " *"));
    }
  }
  if (stars > 0 && !any_insert)
    stop(std::string(glob_name) + " glob " + in_quotes(glob) + " matches many tensors but " +
         template_name +
         " inserts none of its captures ({1}): they would all pair with the "
         "same tensors");
  return e;
}

MapIgnore parse_ignore(simdjson::dom::element item, std::size_t number, const std::string& origin) {
  const std::string where = "ignore " + std::to_string(number);
  simdjson::dom::object obj;
  if (item.get(obj)) fail(origin, where + " must be an object");
  detail::refuse_repeated_keys(obj, origin, where);
  MapIgnore ig;
  bool has_glob = false, has_reason = false;
  for (auto f : obj) {
    const std::string k(f.key);
    std::string_view s;
    if (k == "ref" || k == "test") {
      if (has_glob) fail(origin, where + " names both ref and test: one ignore per side");
      if (f.value.get(s) || s.empty()) fail(origin, where + ": " + k + " must be a glob");
      ig.ref_side = k == "ref";
      ig.glob = std::string(s);
      has_glob = true;
    } else if (k == "reason") {
      if (f.value.get(s)) fail(origin, where + ": reason must be a string");
      ig.reason = std::string(s);
      has_reason = !is_blank(ig.reason);
    } else {
      fail(origin, where + ": unknown field \"" + k + "\" (expected ref or test, and reason)");
    }
  }
  if (!has_glob) fail(origin, where + " needs \"ref\" or \"test\": the glob of what it leaves out");
  if (!has_reason)
    fail(origin, where + " (" + (ig.ref_side ? "ref " : "test ") + in_quotes(ig.glob) +
                     ") needs a written reason: a tensor left unjudged must say why");
  return ig;
}

}  // namespace

TensorMap TensorMap::parse(std::string_view json, const std::string& origin) {
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  if (auto err = parser.parse(simdjson::padded_string(json)).get(doc))
    fail(origin, std::string("map is not valid JSON: ") + simdjson::error_message(err));
  simdjson::dom::object root;
  if (doc.get(root)) fail(origin, "a map must be a JSON object with \"map\" and \"ignore\"");
  detail::refuse_repeated_keys(root, origin, "the map");
  TensorMap m;
  m.origin = origin;
  bool has_map = false;
  for (auto field : root) {
    const std::string key(field.key);
    simdjson::dom::array list;
    if (key != "map" && key != "ignore")
      fail(origin, "unknown field \"" + key + "\" (expected map, ignore)");
    if (field.value.get(list)) fail(origin, "\"" + key + "\" must be a list");
    std::size_t n = 0;
    for (auto item : list) {
      if (key == "map")
        m.entries.push_back(parse_entry(item, ++n, origin));
      else
        m.ignore.push_back(parse_ignore(item, ++n, origin));
    }
    has_map = has_map || key == "map";
  }
  if (!has_map) fail(origin, "a map needs \"map\": the list of entries");
  return m;
}

TensorMap TensorMap::load(const std::string& path) {
  return parse(detail::read_regular_file(path, "map file", detail::kMaxSettingsFile), path);
}

namespace {

// What the stars of `glob` capture in `name`, which the caller knows it matches.
std::optional<std::vector<std::string_view>> captures_of_match(std::string_view glob,
                                                               std::string_view name) {
  // Characters as Glob reads them (a code point, or one byte that is not UTF-8), so '?' and
  // the captures' ends agree with the matcher; `at` holds each character's byte offset.
  static constexpr std::uint32_t kStar = 0xFFFFFFFE, kAny = 0xFFFFFFFF;
  auto decode = [](std::string_view s, bool wildcards, std::vector<std::uint32_t>& units,
                   std::vector<std::size_t>& at) {
    for (std::size_t i = 0; i < s.size();) {
      const detail::Utf8Char c = detail::next_char(s, i);
      at.push_back(i);
      const std::uint32_t u = !c.valid ? 0x110000u + static_cast<unsigned char>(s[i]) : c.cp;
      units.push_back(wildcards && u == '*' ? kStar : wildcards && u == '?' ? kAny : u);
      i += c.valid ? c.len : 1;
    }
    at.push_back(s.size());
  };
  std::vector<std::uint32_t> pat, text;
  std::vector<std::size_t> pat_at, text_at;
  decode(glob, true, pat, pat_at);
  decode(name, false, text, text_at);
  // The segments between stars, each matched where it first can: the leftmost placement
  // leaves every star as short as possible (a later star takes up whatever an earlier one
  // would have), and is found without recursion or backtracking. The last segment is
  // anchored at the name's end.
  const auto fits = [&](std::size_t p, std::size_t len, std::size_t n) {
    for (std::size_t k = 0; k < len; ++k) {
      if (pat[p + k] != kAny && pat[p + k] != text[n + k]) return false;
    }
    return true;
  };
  std::vector<std::size_t> stars;
  for (std::size_t p = 0; p < pat.size(); ++p) {
    if (pat[p] == kStar) stars.push_back(p);
  }
  if (stars.empty()) {
    if (pat.size() != text.size() || !fits(0, pat.size(), 0)) return std::nullopt;
    return std::vector<std::string_view>{};
  }
  const std::size_t head = stars.front(), tail = pat.size() - stars.back() - 1;
  if (head + tail > text.size() || !fits(0, head, 0) ||
      !fits(stars.back() + 1, tail, text.size() - tail)) {
    return std::nullopt;
  }
  std::vector<std::string_view> caps;
  const auto capture = [&](std::size_t from, std::size_t to) {
    caps.push_back(name.substr(text_at[from], text_at[to] - text_at[from]));
  };
  std::size_t n = head;
  const std::size_t limit = text.size() - tail;  // where the last segment starts
  for (std::size_t i = 0; i + 1 < stars.size(); ++i) {
    const std::size_t p = stars[i] + 1, len = stars[i + 1] - p;
    std::size_t at = n;
    while (at + len <= limit && !fits(p, len, at)) ++at;
    if (at + len > limit) return std::nullopt;
    capture(n, at);
    n = at + len;
  }
  capture(n, limit);
  return caps;
}

}  // namespace

std::optional<std::vector<std::string_view>> glob_captures(std::string_view glob,
                                                           std::string_view name) {
  if (!Glob(glob).match(name)) return std::nullopt;
  return captures_of_match(glob, name);
}

namespace {

std::string expand(const std::string& text, const std::vector<std::string_view>& caps) {
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '{') {
      out += text[i];
      continue;
    }
    std::size_t j = i + 1, n = 0;
    while (text[j] != '}') n = n * 10 + static_cast<std::size_t>(text[j++] - '0');
    out += caps[n - 1];
    i = j;
  }
  return out;
}

// A dim given as in torch (negative from the end) as a position, or nothing when outside.
std::optional<std::size_t> dim_of(std::int64_t d, std::size_t rank) {
  const std::int64_t r = static_cast<std::int64_t>(rank);
  if (d < -r || d >= r) return std::nullopt;
  return static_cast<std::size_t>(d < 0 ? d + r : d);
}

// "x[:, 64:96]": a piece of x along `dim`, as a torch user would index it.
std::string slice_text(const std::string& name, std::size_t dim, std::uint64_t begin,
                       std::uint64_t end) {
  std::string s = name + "[";
  for (std::size_t d = 0; d <= dim; ++d) {
    if (d) s += ", ";
    s += d == dim ? std::to_string(begin) + ":" + std::to_string(end) : ":";
  }
  return s + "]";
}

// Whether `parts`, side by side along `dim`, make `whole`: each has its rank and every other
// dim, and their extents along `dim` add up to its.
bool tiles(const std::vector<const Shape*>& parts, const Shape& whole, std::size_t dim) {
  std::uint64_t total = 0;
  for (const Shape* p : parts) {
    if (p->size() != whole.size()) return false;
    for (std::size_t d = 0; d < whole.size(); ++d)
      if (d != dim && (*p)[d] != whole[d]) return false;
    total += whole.empty() ? 0 : (*p)[dim];
  }
  return whole.empty() || total == whole[dim];
}

// One test tensor as the map reads it: its shape and strides, transposed when asked.
struct Operand {
  std::string name;
  const TensorView* view;
  Shape shape;
  std::vector<std::int64_t> strides;
};

// A resolved entry for one match: which ref tensors it judges, from which test tensors.
struct Assignment {
  const MapEntry* entry;
  std::vector<std::string> test, ref;
};

class Pairer {
 public:
  Pairer(const std::vector<const Trace*>& tests, const Trace& ref, const Trace* truth,
         const TensorMap& map, Pairing& out)
      : tests_(tests), test_(*tests.front()), ref_(ref), truth_(truth), map_(map), out_(out) {
    for (const MapIgnore& ig : map.ignore) ignore_globs_.emplace_back(ig.glob);
  }

  void resolve_entries();
  void pair(const std::vector<std::string>& only);

 private:
  std::string where(const MapEntry& e) const {
    return map_.origin + ": map entry " + std::to_string(e.number);
  }
  void claim(const std::string& ref_name, const Assignment* a);
  bool operand(const MapEntry& e, const std::string& name, Operand& op, std::string& problem,
               std::size_t rank = 0);
  // For a test run of several ranks: every rank's copy of a replicated tensor must equal
  // rank 0's; sets a problem (cannot compare) or a failure (they differ).
  void check_replicas(const std::string& name, std::string& problem, std::string& failure) const;
  void judge_pieces_of_test(const Assignment& a);  // ref list: the test tensor holds them
  void judge_concatenation(const Assignment& a);   // test list (or one): the ref tensor
  void add(const std::string& ref_name, const TensorView* test, std::string source,
           std::string problem, std::string failure = "");
  bool ignored(bool ref_side, const std::string& name, std::size_t* which = nullptr) const;

  const std::vector<const Trace*>& tests_;
  const Trace& test_;  // rank 0's, or the one test run
  const Trace& ref_;
  const Trace* truth_;
  const TensorMap& map_;
  Pairing& out_;
  std::vector<Glob> ignore_globs_;  // compiled once: every unmapped name meets them
  std::deque<Assignment> assignments_;
  // ref name -> the assignment that judges it (nullptr: claimed by two entries)
  std::unordered_map<std::string, const Assignment*> claimed_;
  std::unordered_map<std::string, std::string> claim_conflict_;
  std::unordered_set<std::string> used_test_;
  std::unordered_map<std::string, TensorTriple> mapped_;  // ref name -> triple
};

bool Pairer::ignored(bool ref_side, const std::string& name, std::size_t* which) const {
  for (std::size_t i = 0; i < map_.ignore.size(); ++i) {
    const MapIgnore& ig = map_.ignore[i];
    if (ig.ref_side == ref_side && ignore_globs_[i].match(name)) {
      if (which) *which = i;
      return true;
    }
  }
  return false;
}

void Pairer::claim(const std::string& ref_name, const Assignment* a) {
  const auto [it, added] = claimed_.emplace(ref_name, a);
  if (added) return;
  if (it->second == a) {  // one entry's list repeats it: which piece is it?
    claim_conflict_[ref_name] = "map entry " + std::to_string(a->entry->number) + " names it twice";
  } else if (it->second) {
    claim_conflict_[ref_name] = "map entries " + std::to_string(it->second->entry->number) +
                                " and " + std::to_string(a->entry->number) + " both map it";
  }
  it->second = nullptr;
}

void Pairer::resolve_entries() {
  std::map<std::size_t, std::string> first_unmatched;  // entry -> a ref name it missed
  for (const MapEntry& e : map_.entries) {
    const std::string& glob = e.glob_on_test ? e.test.front() : e.ref.front();
    const Trace& matched = e.glob_on_test ? test_ : ref_;
    std::size_t matches = 0;
    const Glob compiled(glob);  // once per entry; captures are found for matches only
    for (const TraceEntry& t : matched.entries()) {
      if (!compiled.match(t.name)) continue;
      const auto caps = captures_of_match(glob, t.name);
      if (!caps) continue;
      Assignment a{&e, {}, {}};
      for (const auto& s : e.glob_on_test ? e.ref : e.test)
        (e.glob_on_test ? a.ref : a.test).push_back(expand(s, *caps));
      (e.glob_on_test ? a.test : a.ref).push_back(t.name);
      if (e.test_named_as_ref) a.test.push_back(t.name);
      // `*` crosses dots, so a test glob also matches tensors of submodules ("blocks.*.out"
      // matches "blocks.0.mlp.out"): a match that names no tensor of ref at all is no pair
      // (ref's coverage keeps this fail closed: every ref tensor is judged or ignored).
      if (e.glob_on_test && std::none_of(a.ref.begin(), a.ref.end(),
                                         [&](const std::string& r) { return ref_.find(r); })) {
        if (!first_unmatched.count(e.number)) first_unmatched[e.number] = a.ref.front();
        continue;
      }
      ++matches;
      assignments_.push_back(std::move(a));
      for (const auto& r : assignments_.back().ref) claim(r, &assignments_.back());
      for (const auto& n : assignments_.back().test) used_test_.insert(n);
    }
    if (matches == 0) {
      const auto u = first_unmatched.find(e.number);
      out_.warnings.push_back(
          where(e) + " (" + (e.glob_on_test ? "test " : "ref ") + in_quotes(glob) +
          ") matched no tensor of " + (e.glob_on_test ? "test" : "ref") +
          (u == first_unmatched.end()
               ? ""
               : " whose ref tensors exist (ref has no " + in_quotes(u->second) + ", for one)"));
    }
  }
  for (const Assignment& a : assignments_) {
    // Every named ref tensor must exist: an entry that points past ref is a wrong map.
    bool all_there = true;
    for (const auto& r : a.ref) {
      if (ref_.find(r)) continue;
      all_there = false;
      out_.could_not_judge.push_back(where(*a.entry) + ": test " + in_quotes(a.test.front()) +
                                     " maps to ref " + in_quotes(r) + ", which ref does not hold");
    }
    if (!all_there) continue;
    if (a.ref.size() > 1 || a.entry->ref_is_list)
      judge_pieces_of_test(a);
    else
      judge_concatenation(a);
  }
}

void Pairer::add(const std::string& ref_name, const TensorView* test, std::string source,
                 std::string problem, std::string failure) {
  if (claimed_.at(ref_name) == nullptr) return;  // a conflict: reported once, in pair()
  const TraceEntry* r = ref_.find(ref_name);
  const TraceEntry* u = truth_ ? truth_->find(ref_name) : nullptr;
  TensorTriple t(ref_name, test, &r->view, u ? &u->view : nullptr);
  t.source = std::move(source);
  t.problem = std::move(problem);
  t.failure = std::move(failure);
  mapped_.insert_or_assign(ref_name, std::move(t));
}

bool Pairer::operand(const MapEntry& e, const std::string& name, Operand& op, std::string& problem,
                     std::size_t rank) {
  const TraceEntry* t = tests_[rank]->find(name);
  if (!t) {
    problem = where(e) + ": test" +
              (tests_.size() > 1 ? " rank " + std::to_string(rank) : std::string()) +
              " has no tensor " + in_quotes(name);
    return false;
  }
  op = {name, &t->view, t->view.shape, contiguous_strides(t->view.shape)};
  if (e.transpose) {
    const auto a = dim_of((*e.transpose)[0], op.shape.size());
    const auto b = dim_of((*e.transpose)[1], op.shape.size());
    if (!a || !b) {
      problem = where(e) + ": transpose [" + std::to_string((*e.transpose)[0]) + ", " +
                std::to_string((*e.transpose)[1]) + "] is outside test " + in_quotes(name) + "'s " +
                std::to_string(op.shape.size()) + " dims";
      return false;
    }
    std::swap(op.shape[*a], op.shape[*b]);
    std::swap(op.strides[*a], op.strides[*b]);
  }
  return true;
}

void Pairer::judge_pieces_of_test(const Assignment& a) {
  const MapEntry& e = *a.entry;
  std::string problem;
  std::string failure;
  Operand x;
  const bool have = operand(e, a.test.front(), x, problem);
  if (have) check_replicas(x.name, problem, failure);
  std::optional<std::size_t> dim;
  if (have) {
    dim = dim_of(*e.cat_dim, x.shape.size());
    if (!dim)
      problem = where(e) + ": cat_dim " + std::to_string(*e.cat_dim) + " is outside test " +
                in_quotes(x.name) + "'s " + std::to_string(x.shape.size()) + " dims";
  }
  // The ref tensors must tile the test tensor along dim, matching it in every other dim.
  std::vector<const Shape*> pieces;
  for (const auto& r : a.ref) pieces.push_back(&ref_.find(r)->view.shape);
  if (problem.empty() && !tiles(pieces, x.shape, *dim)) {
    std::string sizes;
    for (std::size_t i = 0; i < a.ref.size(); ++i)
      sizes += (i ? " + " : "") + in_quotes(a.ref[i]) + " " + format_shape(*pieces[i]);
    problem = where(e) + ": sizes do not add up: ref " + sizes + " along dim " +
              std::to_string(*e.cat_dim) + " do not make test " + in_quotes(x.name) + " " +
              format_shape(x.shape) + (e.transpose ? " (transposed)" : "");
  }
  if (!problem.empty()) {
    for (const auto& r : a.ref) add(r, nullptr, a.test.front(), problem);
    return;
  }
  const std::size_t es = element_size(x.view->dtype);
  // Pieces whose elements lie in one run (a split of the outermost dim that is not 1) are
  // read in place as they are; others through a layout.
  bool one_run = x.strides == contiguous_strides(x.shape);
  for (std::size_t d = 0; d < *dim; ++d) one_run = one_run && x.shape[d] == 1;
  std::uint64_t at = 0;
  for (std::size_t i = 0; i < a.ref.size(); ++i) {
    const std::string& r = a.ref[i];
    const Shape& s = *pieces[i];
    const std::uint64_t extent = s[*dim];
    const std::byte* start = x.view->data + static_cast<std::int64_t>(at) * x.strides[*dim] *
                                                static_cast<std::int64_t>(es);
    TensorView piece{x.view->dtype, s, nullptr};
    if (one_run) {
      piece.data = start;
    } else {
      out_.layouts.push_back(Layout{*dim, {StridedPart{start, x.strides, extent}}});
      piece.layout = &out_.layouts.back();
    }
    out_.views.push_back(piece);
    std::string source = slice_text(x.name, *dim, at, at + extent);
    if (e.transpose) source = x.name + " transposed, " + source.substr(x.name.size());
    add(r, &out_.views.back(), std::move(source), "", failure);
    at += extent;
  }
}

void Pairer::judge_concatenation(const Assignment& a) {
  const MapEntry& e = *a.entry;
  const std::string& r = a.ref.front();
  const Shape& s = ref_.find(r)->view.shape;
  // The parts side by side: the test list's tensors (rank 0's, the others' copies agreeing),
  // or one tensor's pieces on every rank, in rank order.
  const bool sharded = e.sharded_dim.has_value();
  const std::size_t n = sharded ? tests_.size() : a.test.size();
  const std::optional<std::int64_t> along = sharded ? e.sharded_dim : e.cat_dim;
  std::string problem, failure;
  std::vector<Operand> parts(n);
  std::vector<std::string> labels(n);
  for (std::size_t i = 0; i < n && problem.empty(); ++i) {
    const std::string& name = sharded ? a.test.front() : a.test[i];
    operand(e, name, parts[i], problem, sharded ? i : 0);
    labels[i] = sharded ? "rank " + std::to_string(i) : name;
    if (!sharded && problem.empty()) check_replicas(name, problem, failure);
  }
  std::size_t dim = 0;
  if (problem.empty() && along) {
    const auto d = dim_of(*along, s.size());
    if (!d)
      problem = where(e) + ": " + (sharded ? "sharded_dim " : "cat_dim ") + std::to_string(*along) +
                " is outside ref " + in_quotes(r) + "'s " + std::to_string(s.size()) + " dims";
    dim = d.value_or(0);
  }
  std::string source =
      sharded ? a.test.front() + " on ranks 0-" + std::to_string(n - 1) + " along dim " +
                    std::to_string(*along)
      : n == 1 ? a.test.front()
               : "cat(" + detail::joined(a.test, ", ") + "; dim " + std::to_string(*along) + ")";
  if (e.transpose) source += n == 1 ? " transposed" : ", each transposed";
  if (problem.empty()) {
    // The parts must tile ref along dim (one part: be ref's shape), in one dtype.
    std::vector<const Shape*> shapes;
    bool fits = true;
    std::string sizes;
    for (std::size_t i = 0; i < n; ++i) {
      const Operand& p = parts[i];
      shapes.push_back(&p.shape);
      sizes += (i ? " + " : "") + (sharded ? labels[i] : in_quotes(labels[i])) + " " +
               format_shape(p.shape);
      fits = fits && p.view->dtype == parts.front().view->dtype;
    }
    if (!fits || !tiles(shapes, s, dim)) {
      problem = where(e) +
                (n == 1 ? ": test " + sizes + " does not fit ref "
                        : ": sizes do not add up: test " + sizes + " along dim " +
                              std::to_string(*along) + " do not make ref ") +
                in_quotes(r) + " " + format_shape(s);
      if (n == 1 && !e.transpose) problem.clear();  // the judge's shape mismatch says it
    }
  }
  if (!problem.empty()) {
    add(r, nullptr, source, problem);
    return;
  }
  const Operand& first = parts.front();
  if (n == 1 && (s.empty() || first.strides == contiguous_strides(first.shape))) {
    add(r, first.view, first.name == r && !sharded ? "" : source, "", failure);
    return;
  }
  Layout layout{dim, {}};
  for (const auto& p : parts) layout.parts.push_back({p.view->data, p.strides, p.shape[dim]});
  out_.layouts.push_back(std::move(layout));
  out_.views.push_back(TensorView{first.view->dtype, s, nullptr, &out_.layouts.back()});
  add(r, &out_.views.back(), std::move(source), "", failure);
}

void Pairer::check_replicas(const std::string& name, std::string& problem,
                            std::string& failure) const {
  const TraceEntry* rank0 = test_.find(name);
  if (!rank0) return;
  for (std::size_t rank = 1; rank < tests_.size() && problem.empty() && failure.empty(); ++rank) {
    const TraceEntry* mine = tests_[rank]->find(name);
    const std::string who = "rank " + std::to_string(rank);
    const std::string hint =
        ": if the ranks hold pieces of it, say so in a map entry (\"sharded_dim\")";
    if (!mine) {
      problem = who + " has no tensor " + in_quotes(name) + ", which rank 0 holds" + hint;
    } else if (mine->view.dtype != rank0->view.dtype || mine->view.shape != rank0->view.shape) {
      problem = who + " holds it as " + std::string(numalign::name(mine->view.dtype)) + " " +
                format_shape(mine->view.shape) + ", rank 0 as " +
                std::string(numalign::name(rank0->view.dtype)) + " " +
                format_shape(rank0->view.shape) + hint;
    } else if (const auto d = compare_with_rank0(mine->view, rank0->view, rank)) {
      failure = "replicated, but " + who + " differs from rank 0 in " +
                std::to_string(d->elements_differ) + " element(s), the first at " +
                format_index(rank0->view.shape, d->first_index) + ": " +
                detail::format_number(d->value) +
                " (rank 0: " + detail::format_number(d->rank0_value) + ")" + hint;
    }
  }
}

void Pairer::pair(const std::vector<std::string>& only) {
  // Ref's tensors in execution order when recorded, else file order (as pair_tensors).
  std::vector<const TraceEntry*> ordered;
  std::unordered_set<const TraceEntry*> placed;
  if (ref_.metadata()) {
    for (const auto& n : ref_.metadata()->order)
      if (const TraceEntry* e = ref_.find(n); e && placed.insert(e).second) ordered.push_back(e);
  }
  for (const auto& e : ref_.entries())
    if (placed.insert(&e).second) ordered.push_back(&e);
  std::vector<std::size_t> ignored_count(map_.ignore.size(), 0);
  for (const TraceEntry* r : ordered) {
    const std::string& n = r->name;
    if (!selected_by(only, n)) continue;
    if (const auto c = claim_conflict_.find(n); c != claim_conflict_.end()) {
      const TraceEntry* u = truth_ ? truth_->find(n) : nullptr;  // else "missing from truth"
      out_.triples.emplace_back(n, nullptr, &r->view, u ? &u->view : nullptr).problem =
          map_.origin + ": " + c->second;
      continue;
    }
    if (const auto m = mapped_.find(n); m != mapped_.end()) {
      out_.triples.push_back(std::move(m->second));
      continue;
    }
    if (claimed_.count(n)) continue;  // its entry could not use it: said in could_not_judge
    if (std::size_t which; ignored(true, n, &which)) {
      ++ignored_count[which];
      continue;
    }
    const TraceEntry* t = test_.find(n);
    const TraceEntry* u = truth_ ? truth_->find(n) : nullptr;
    TensorTriple& triple =
        out_.triples.emplace_back(n, t ? &t->view : nullptr, &r->view, u ? &u->view : nullptr);
    if (t) {
      used_test_.insert(n);
      check_replicas(n, triple.problem, triple.failure);
    } else if (!map_.origin.empty()) {  // without a map, the judge says "missing from test"
      triple.problem = "not mapped: no entry of " + map_.origin +
                       " maps it, no ignore covers it, and test has no tensor of that name";
    }
  }
  for (const auto& e : test_.entries()) {
    if (used_test_.count(e.name) || !selected_by(only, e.name)) continue;
    if (std::size_t which; ignored(false, e.name, &which)) {
      ++ignored_count[which];
      continue;
    }
    out_.triples.emplace_back(e.name, &e.view, nullptr);
  }
  // A tensor a later rank holds and rank 0 does not: no pairing reads it, and the ranks of one
  // run should hold the same names. Ref's names were listed above (missing from test).
  std::unordered_set<std::string_view> stray;  // named once, at the first rank holding it
  for (std::size_t r = 1; r < tests_.size(); ++r) {
    for (const auto& e : tests_[r]->entries()) {
      if (test_.find(e.name) || ref_.find(e.name) || !selected_by(only, e.name)) continue;
      if (ignored(false, e.name) || !stray.insert(e.name).second) continue;
      out_.triples.emplace_back(e.name, nullptr, nullptr).problem =
          "only on rank " + std::to_string(r) +
          " of test: rank 0 and ref have no tensor of that name";
    }
  }
  // Every ignore, with what it left out and why: the report shows what was not judged.
  for (std::size_t i = 0; i < map_.ignore.size(); ++i) {
    const MapIgnore& ig = map_.ignore[i];
    out_.warnings.push_back("the map leaves out " + std::to_string(ignored_count[i]) +
                            " tensor(s) of " + (ig.ref_side ? "ref" : "test") + " matching " +
                            in_quotes(ig.glob) + ", not judged: " + ig.reason);
  }
}

}  // namespace

std::string rank_trace_path(const std::string& path, std::size_t rank) {
  // As os.path.splitext: the extension is the last dot of the file name, unless the name
  // starts with it.
  const std::size_t slash = path.find_last_of('/');
  const std::size_t name = slash == std::string::npos ? 0 : slash + 1;
  std::size_t dot = path.find_last_of('.');
  std::size_t lead = name;
  while (lead < path.size() && path[lead] == '.') ++lead;
  if (dot == std::string::npos || dot < lead) dot = path.size();
  const std::string ext = dot < path.size() ? path.substr(dot) : ".safetensors";
  return path.substr(0, dot) + ".rank" + std::to_string(rank) + ext;
}

Pairing pair_with_map(const std::vector<const Trace*>& test_ranks, const Trace& ref,
                      const Trace* truth, const TensorMap& map,
                      const std::vector<std::string>& only) {
  if (test_ranks.empty()) fail("test", "no trace given");
  Pairing out;
  Pairer p(test_ranks, ref, truth, map, out);
  p.resolve_entries();
  p.pair(only);
  return out;
}

}  // namespace numalign
