#include "tiers/shared/resp_reader.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstring>

namespace kvoffload::detail {
namespace {

constexpr std::size_t kMinRead = 16 << 10;
constexpr std::size_t kFirstBuffer = 64 << 10;

/// A whole line of digits (an optional '-') as a number, else false.
bool parse_number(std::string_view digits, long long& out) {
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), out);
  return !digits.empty() && ec == std::errc{} && end == digits.data() + digits.size();
}

}  // namespace

RespReader::RespReader(RespLimits limits)
    : limits_(limits), buf_(kFirstBuffer), budget_(limits.max_reply_bytes) {}

void RespReader::expect(std::span<std::byte> into, std::size_t prefix) noexcept {
  into_ = into;
  prefix_ = prefix;
  expecting_ = true;
}

std::span<char> RespReader::space() {
  if (pos_ == len_) {
    pos_ = len_ = scan_ = 0;
  } else if (pos_ > 0 && buf_.size() - len_ < kMinRead) {
    // What is left is part of one line (at most max_line) or of a bulk string's CRLF.
    std::memmove(buf_.data(), buf_.data() + pos_, len_ - pos_);
    len_ -= pos_;
    scan_ -= std::min(scan_, pos_);
    pos_ = 0;
  }
  if (buf_.size() - len_ < kMinRead) buf_.resize(len_ + kMinRead);
  return {buf_.data() + len_, buf_.size() - len_};
}

void RespReader::commit(std::size_t n) noexcept {
  len_ += n;
}

std::span<char> RespReader::direct() noexcept {
  if (phase_ != Phase::bulk || sink_ != Sink::in_place || crlf_ || pos_ != len_ ||
      bulk_done_ < prefix_ || bulk_left_ == 0) {
    return {};
  }
  return {reinterpret_cast<char*>(into_.data()) + (bulk_done_ - prefix_), bulk_left_};
}

void RespReader::commit_direct(std::size_t n) noexcept {
  bulk_done_ += n;
  bulk_left_ -= n;
}

RespReader::Status RespReader::fail(std::string why) {
  error_ = std::move(why);
  return Status::error;
}

bool RespReader::charge(std::size_t bytes) {
  if (spent_ > budget_ || bytes > budget_ - spent_) return false;
  spent_ += bytes;
  return true;
}

RespValue& RespReader::slot(RespValue& out) {
  if (frames_.empty()) return out;
  const Frame& f = frames_.back();
  return f.array->elements[f.next];
}

bool RespReader::finish() {
  while (!frames_.empty()) {
    Frame& f = frames_.back();
    if (++f.next < f.array->elements.size()) return false;
    frames_.pop_back();
  }
  return true;
}

RespReader::Status RespReader::complete() {
  started_ = false;
  expecting_ = false;
  into_ = {};
  prefix_ = 0;
  budget_ = limits_.max_reply_bytes;
  return Status::done;
}

RespReader::Status RespReader::parse(RespValue& out) {
  if (!error_.empty()) return Status::error;
  if (!started_) {
    out = RespValue{};
    frames_.clear();
    spent_ = sizeof(RespValue);
    started_ = true;
  }
  for (;;) {
    Status s = Status::more;
    if (phase_ == Phase::bulk) {
      s = bulk();
      if (s == Status::more) return s;
    } else {
      // The end of the line, searched from where the last search stopped (a line that
      // arrives a byte at a time costs its length, not its length squared).
      const char* from = buf_.data() + std::max(scan_, pos_);
      const auto* nl = static_cast<const char*>(std::memchr(from, '\n', buf_.data() + len_ - from));
      if (nl == nullptr) {
        scan_ = len_;
        if (len_ - pos_ > limits_.max_line + 1) {
          return fail(fmt::format("a reply line is longer than {} bytes", limits_.max_line));
        }
        return Status::more;
      }
      const auto end = static_cast<std::size_t>(nl - buf_.data());
      if (end == pos_ || buf_[end - 1] != '\r') return fail("a reply line does not end in CRLF");
      if (end - 1 - pos_ > limits_.max_line) {
        return fail(fmt::format("a reply line is longer than {} bytes", limits_.max_line));
      }
      const std::string_view line(buf_.data() + pos_, end - 1 - pos_);
      pos_ = end + 1;
      scan_ = pos_;
      s = on_line(line, out);
    }
    if (s == Status::error) return s;
    if (s == Status::done && finish()) return complete();
    // Else a value opened (an array, a bulk string) or an element ended: go on.
  }
}

RespReader::Status RespReader::on_line(std::string_view line, RespValue& out) {
  if (line.empty()) return fail("an empty reply line");
  RespValue& v = slot(out);
  const std::string_view rest = line.substr(1);
  long long n = 0;
  switch (line[0]) {
    case '+':
    case '-':
      if (!charge(rest.size())) return fail("a reply over its budget");
      v.type = line[0] == '+' ? RespType::status : RespType::error;
      v.text.assign(rest);
      return Status::done;
    case ':':
      if (!parse_number(rest, n)) return fail("an integer reply that is not a number");
      v.type = RespType::integer;
      v.integer = n;
      return Status::done;
    case '$': {
      if (!parse_number(rest, n) || n < -1) return fail("a bulk string with a bad length");
      if (n == -1) {
        v.type = RespType::nil;
        return Status::done;
      }
      const auto size = static_cast<unsigned long long>(n);
      const bool top = frames_.empty();
      v.type = RespType::string;
      bulk_ = &v;
      bulk_done_ = 0;
      bulk_left_ = static_cast<std::size_t>(std::min<unsigned long long>(size, SIZE_MAX - 2));
      crlf_ = false;
      const bool expected = top && expecting_;
      if (expected && size == prefix_ + into_.size() && charge(prefix_)) {
        sink_ = Sink::in_place;
        v.in_place = true;
        v.text.reserve(prefix_);
      } else if ((!expected || size < prefix_ + into_.size()) && size <= budget_ &&
                 charge(static_cast<std::size_t>(size))) {
        sink_ = Sink::text;
        v.text.reserve(static_cast<std::size_t>(size));
      } else if (expected) {
        sink_ = Sink::drop;  // longer than asked for, or over the budget: read past, never held
        v.skipped = true;
      } else {
        return fail(fmt::format("a bulk string of {} bytes is over the reply's budget of {}", size,
                                budget_));
      }
      phase_ = Phase::bulk;
      return Status::more;
    }
    case '*': {
      if (!parse_number(rest, n) || n < -1) return fail("an array with a bad length");
      if (n == -1) {
        v.type = RespType::nil;
        return Status::done;
      }
      if (frames_.size() >= limits_.max_depth) {
        return fail(fmt::format("arrays nested deeper than {}", limits_.max_depth));
      }
      const auto count = static_cast<unsigned long long>(n);
      if (spent_ > budget_ || count > (budget_ - spent_) / sizeof(RespValue) ||
          !charge(static_cast<std::size_t>(count) * sizeof(RespValue))) {
        return fail(fmt::format("an array of {} elements is over the reply's budget of {} bytes",
                                count, budget_));
      }
      v.type = RespType::array;
      v.elements.resize(static_cast<std::size_t>(count));
      if (count == 0) return Status::done;
      frames_.push_back(Frame{&v, 0});
      return Status::more;
    }
    default:
      // RESP3 types never come: we never send HELLO 3.
      return fail(fmt::format("an unexpected reply type byte 0x{:02x}",
                              static_cast<unsigned char>(line[0])));
  }
}

RespReader::Status RespReader::bulk() {
  while (!crlf_ && bulk_left_ > 0) {
    const std::size_t avail = len_ - pos_;
    if (avail == 0) return Status::more;
    std::size_t take = std::min(avail, bulk_left_);
    const char* p = buf_.data() + pos_;
    switch (sink_) {
      case Sink::text: bulk_->text.append(p, take); break;
      case Sink::in_place: {
        if (bulk_done_ < prefix_) {  // the header, kept as the reply's text
          take = std::min(take, prefix_ - bulk_done_);
          bulk_->text.append(p, take);
        } else {
          std::memcpy(into_.data() + (bulk_done_ - prefix_), p, take);
        }
        break;
      }
      case Sink::drop: break;
    }
    pos_ += take;
    bulk_done_ += take;
    bulk_left_ -= take;
  }
  crlf_ = true;
  if (len_ - pos_ < 2) return Status::more;
  if (buf_[pos_] != '\r' || buf_[pos_ + 1] != '\n') {
    return fail("a bulk string does not end in CRLF");
  }
  pos_ += 2;
  scan_ = pos_;
  phase_ = Phase::line;
  crlf_ = false;
  bulk_ = nullptr;
  return Status::done;
}

}  // namespace kvoffload::detail
