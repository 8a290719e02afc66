#pragma once
// What a text input's first bytes say about its encoding, one rule for every
// reader of text (route trace CSV, timing config, metrics, lanes curve, oracle
// profile, lab CSVs): a UTF-8 byte-order mark is skipped; compressed data and
// UTF-16/32 text are refused, named, with how to make the file readable.

#include <string>
#include <string_view>

#include "moe_residency/error.hpp"

namespace moe_residency {
namespace detail {

/// What an input's first bytes show it is instead of text in UTF-8 (or
/// ASCII): compressed data (gzip, zstd, xz, bzip2, a zip archive), or text in
/// UTF-16 or UTF-32 (a byte-order mark). `what` is empty when it is none of
/// them; a UTF-8 byte-order mark is not a problem (every text reader skips it,
/// strip_utf8_bom).
struct foreign_encoding {
  std::string what;    ///< "gzip-compressed data (magic bytes 1f 8b)"
  std::string remedy;  ///< "decompress it first (gunzip -k FILE)"
  explicit operator bool() const noexcept { return !what.empty(); }
};

inline foreign_encoding find_foreign_encoding(std::string_view head) {
  auto starts = [head](std::string_view magic) { return head.substr(0, magic.size()) == magic; };
  using namespace std::string_view_literals;
  if (starts("\x1f\x8b"sv)) return {"gzip-compressed data (magic bytes 1f 8b)", "decompress it first (gunzip -k FILE)"};
  if (starts("\x28\xb5\x2f\xfd"sv))
    return {"zstd-compressed data (magic bytes 28 b5 2f fd)", "decompress it first (zstd -d FILE)"};
  if (starts("\xfd\x37\x7a\x58\x5a\x00"sv))
    return {"xz-compressed data (magic bytes fd 37 7a 58 5a 00)", "decompress it first (xz -dk FILE)"};
  if (head.size() >= 10 && starts("BZh"sv) && head[3] >= '1' && head[3] <= '9' &&
      head.substr(4, 6) == "\x31\x41\x59\x26\x53\x59"sv)
    return {"bzip2-compressed data (magic bytes 42 5a 68)", "decompress it first (bunzip2 -k FILE)"};
  if (starts("PK\x03\x04"sv)) return {"a zip archive (magic bytes 50 4b 03 04)", "extract the file first (unzip)"};
  // UTF-32 before UTF-16: UTF-32 LE's mark begins with UTF-16 LE's.
  if (starts("\xff\xfe\x00\x00"sv) || starts("\x00\x00\xfe\xff"sv))
    return {std::string("UTF-32 text (byte-order mark ") + (head[0] ? "ff fe 00 00" : "00 00 fe ff") + ")",
            "convert it to UTF-8 first (iconv -f UTF-32 -t UTF-8 FILE)"};
  if (starts("\xff\xfe"sv) || starts("\xfe\xff"sv))
    return {std::string("UTF-16 text (byte-order mark ") + (head[0] == '\xff' ? "ff fe" : "fe ff") + ")",
            "convert it to UTF-8 first (iconv -f UTF-16 -t UTF-8 FILE)"};
  return {};
}

/// Throws "<source>: is <what>; expected <expected>: <remedy>" when `head`
/// shows a foreign encoding (find_foreign_encoding).
inline void check_text_encoding(std::string_view head, const std::string& source, const std::string& expected) {
  if (const foreign_encoding f = find_foreign_encoding(head))
    throw error(source + ": is " + f.what + "; expected " + expected + ": " + f.remedy);
}

/// The UTF-8 byte-order mark (EF BB BF) some editors put at the start of a
/// text file (Windows' Notepad, Excel's "CSV UTF-8").
inline constexpr std::string_view utf8_bom = "\xef\xbb\xbf";

/// `text` without a leading UTF-8 byte-order mark: every text reader of the
/// library skips it, so it never hides a first column's name or a magic line.
inline std::string_view strip_utf8_bom(std::string_view text) noexcept {
  return text.substr(0, utf8_bom.size()) == utf8_bom ? text.substr(utf8_bom.size()) : text;
}

}  // namespace detail
}  // namespace moe_residency
