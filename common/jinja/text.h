// Python's str operations over UTF-8 text, by code point: what templates' string methods
// and filters do (`'héllo'[1:]`, `.strip()`, `.split()`, `.title()`, `|length`).
//
// Case mapping covers ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic (the letters
// chat data holds in practice); other characters keep their case. Invalid UTF-8 reads as
// U+FFFD.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace cleave::jinja::text {

std::u32string decode(const std::string& utf8);
std::string encode(const std::u32string& text);
size_t length(const std::string& utf8);

bool isSpace(char32_t c);  // str.isspace() of one character
char32_t toUpper(char32_t c);
char32_t toLower(char32_t c);
std::string upper(const std::string& s);
std::string lower(const std::string& s);
// str.capitalize(): the first character upper case, the rest lower.
std::string capitalize(const std::string& s);
// str.title(): each run of cased characters starts upper case, the rest lower.
std::string pythonTitle(const std::string& s);
// Jinja's |title: words start after whitespace, '-', '(', '{', '[' or '<'.
std::string jinjaTitle(const std::string& s);

// str.strip / lstrip / rstrip: `chars` unset strips whitespace.
std::string strip(const std::string& s, const std::optional<std::string>& chars, bool left,
                  bool right);
// str.split(sep, maxsplit): `sep` unset splits on runs of whitespace and drops empty parts;
// maxsplit < 0 is unlimited.
std::vector<std::string> split(const std::string& s, const std::optional<std::string>& sep,
                               int64_t maxsplit);
// str.splitlines() (line ends dropped).
std::vector<std::string> splitlines(const std::string& s);
// str.replace(old, new, count); count < 0 replaces all. An empty `old` inserts between
// characters, as Python does.
std::string replace(const std::string& s, const std::string& from, const std::string& to,
                    int64_t count);
// str.find (code point index or -1) and str.count (non-overlapping).
int64_t find(const std::string& s, const std::string& part);
int64_t count(const std::string& s, const std::string& part);

}  // namespace cleave::jinja::text
