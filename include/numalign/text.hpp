// numalign/text.hpp: text that is safe to print, the one escaper of every output (reports,
// inspect, dump, consistent, sensitivity, error messages), and cutting text to columns.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace numalign {

// `s` with everything a terminal would act on shown as an escape: C0 controls and DEL as
// \xNN (newline and tab too), C1 controls (U+0080-U+009F), bidi controls (U+202A-U+202E,
// U+2066-U+2069, U+200E, U+200F, U+061C) and line / paragraph separators as \uNNNN, and each
// byte that is not part of valid UTF-8 as \xNN. Valid UTF-8 otherwise stays as it is; the
// result is always valid UTF-8.
std::string printable(std::string_view s);

// Terminal columns of valid UTF-8 text: 2 for East Asian wide characters and emoji, 0 for
// combining marks and zero-width characters, 1 otherwise.
std::size_t display_width(std::string_view s);

// Exactly `width` columns: padded with spaces, or, when longer, its head, "..." and its tail
// (the tail is what tells tensor names apart), cut between characters.
std::string fit_columns(std::string_view s, std::size_t width);
// Padded with spaces to at least `width` columns; never cut.
std::string pad_columns(std::string_view s, std::size_t width);
// A dotted path (a module's tensor: "model.layers.11.self_attn.q_proj.out") in at most
// `width` columns, by replacing runs of whole components with ".." ("grad..11.mlp.up_proj.weight",
// the prefix before the layer index first): never a component that holds a digit (a layer
// index, a call "#1") nor the last two; the
// path as it is when it fits, or when no such cut makes it fit (the caller wraps it then).
std::string shorten_path(std::string_view s, std::size_t width);
// At most `width` columns of its head, cut between characters, then "..." when it was cut.
std::string cut_columns(std::string_view s, std::size_t width);

}  // namespace numalign
