#pragma once

// Internal: the shared tier's RESP2 reply reader, with a bound on everything it buffers, checked
// before it buffers it. hiredis's reader bounded only what we checked ahead of it (a top-level
// bulk string): an array of a million elements, a bulk string inside an array or a 100 MiB
// error line was buffered whole, and a long line was searched from its start at every read
// (quadratic). This one keeps its place in a line, counts every value against the reply's
// budget as its header arrives, and can stream a top-level bulk string straight into the
// caller's memory (a host block) without holding it.
//
// Not thread-safe: one per connection. The connection reads into space() (or, while a value
// streams in place, into direct()) and calls commit(); parse() then builds the reply.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvoffload::detail {

/// What one reply may hold. Every limit is checked when a value's header arrives, before any
/// of its bytes are kept; a reply that breaks one is a protocol violation (the connection is
/// closed and its commands fail).
struct RespLimits {
  std::size_t max_line = 64 << 10;  ///< a status, error or integer line, or a header
  std::size_t max_depth = 8;        ///< arrays in arrays
  /// A reply's strings plus its values' nodes (an array's elements are charged, at
  /// sizeof(RespValue) each, when its header arrives: `*5000000` is refused before any
  /// allocation). CLUSTER SLOTS of a 1000-node cluster is about 200 KiB.
  std::size_t max_reply_bytes = 8 << 20;
};

enum class RespType : std::uint8_t { string, nil, integer, status, error, array };

struct RespValue {
  RespType type = RespType::nil;
  long long integer = 0;
  std::string text;
  std::vector<RespValue> elements;
  /// A top-level string of exactly prefix + into.size() bytes: text holds the prefix, the rest
  /// went to `into` (RespReader::expect).
  bool in_place = false;
  /// A top-level string read with expect() that is longer than asked for, or over the reply's
  /// budget: its bytes were read and dropped, never buffered; text is empty.
  bool skipped = false;
};

class RespReader {
 public:
  enum class Status : std::uint8_t { more, done, error };

  explicit RespReader(RespLimits limits = {});

  /// For the next reply only: a top-level bulk string of exactly prefix + into.size() bytes
  /// streams its bytes after the prefix into `into`; a longer one, or a shorter one over the
  /// budget, is skipped unbuffered (RespValue::skipped) instead of breaking the connection.
  void expect(std::span<std::byte> into, std::size_t prefix) noexcept;
  /// For the next reply only: a smaller budget than max_reply_bytes (a command whose reply
  /// is an integer or a status line has no use for megabytes).
  void limit_next(std::size_t bytes) noexcept {
    budget_ = std::min(bytes, limits_.max_reply_bytes);
  }

  /// Where the next bytes from the socket go, and how many arrived there.
  [[nodiscard]] std::span<char> space();
  void commit(std::size_t n) noexcept;
  /// While a value streams in place with nothing buffered: the rest of its destination (read
  /// straight into it, no copy), else empty; commit_direct says how much arrived there.
  [[nodiscard]] std::span<char> direct() noexcept;
  void commit_direct(std::size_t n) noexcept;

  /// Parses what has arrived: done (out holds the reply, and the reader is ready for the next),
  /// more (nothing is lost: call again with the same `out` after more bytes), or error
  /// (error() says what; the reader is unusable, as the connection should be).
  Status parse(RespValue& out);
  [[nodiscard]] const std::string& error() const noexcept { return error_; }
  /// Bytes received and not yet parsed (tests).
  [[nodiscard]] std::size_t buffered() const noexcept { return len_ - pos_; }

 private:
  enum class Phase : std::uint8_t { line, bulk };
  enum class Sink : std::uint8_t { text, in_place, drop };
  struct Frame {
    RespValue* array;
    std::size_t next;
  };

  Status fail(std::string why);
  Status on_line(std::string_view line, RespValue& out);
  Status bulk();
  /// The value that the next header fills: the root, or the next element of the open array.
  RespValue& slot(RespValue& out);
  /// A value is complete: moves to the next element, closing finished arrays; true once the
  /// whole reply is.
  bool finish();
  bool charge(std::size_t bytes);
  Status complete();

  RespLimits limits_;
  std::vector<char> buf_;
  std::size_t pos_ = 0;   // first byte not parsed
  std::size_t len_ = 0;   // bytes in buf_
  std::size_t scan_ = 0;  // where the search for the current line's end goes on
  Phase phase_ = Phase::line;
  std::vector<Frame> frames_;
  bool started_ = false;  // a reply is partly parsed (the root is in use)
  std::size_t spent_ = 0;
  std::size_t budget_ = 0;  // this reply's: max_reply_bytes unless limit_next()
  // The bulk string being read.
  RespValue* bulk_ = nullptr;
  Sink sink_ = Sink::text;
  std::size_t bulk_left_ = 0;  // its bytes still to come, CRLF excluded
  std::size_t bulk_done_ = 0;  // its bytes already taken
  bool crlf_ = false;          // the bytes are in; its CRLF is next
  std::span<std::byte> into_;
  std::size_t prefix_ = 0;
  bool expecting_ = false;
  std::string error_;
};

}  // namespace kvoffload::detail
