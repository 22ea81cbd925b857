// The shared tier's value MAC (tiers/shared/value_mac.hpp): GMAC checked against GCM's
// published constants and a bitwise reference GHASH written here, and the one-time key
// checked to cover every byte of name, header and payload.

#include <array>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch_test_macros.hpp>

#include "common/gmac.hpp"
#include "tiers/shared/value_mac.hpp"

namespace kvoffload::detail {
namespace {

using Block = std::array<std::uint8_t, 16>;

Block from_hex(const char* hex) {
  Block b{};
  for (std::size_t i = 0; i < 16; ++i)
    b[i] = static_cast<std::uint8_t>(std::stoul(std::string(hex + 2 * i, 2), nullptr, 16));
  return b;
}

/// GF(2^128) product in GCM's bit order (NIST SP 800-38D, algorithm 1), bit by bit.
Block gf_mul(const Block& x, const Block& y) {
  Block z{};
  Block v = y;
  for (int i = 0; i < 128; ++i) {
    if (((x[i / 8] >> (7 - i % 8)) & 1) != 0) {
      for (int j = 0; j < 16; ++j) z[j] ^= v[j];
    }
    const bool lsb = (v[15] & 1) != 0;
    for (int j = 15; j > 0; --j) v[j] = static_cast<std::uint8_t>((v[j] >> 1) | (v[j - 1] << 7));
    v[0] >>= 1;
    if (lsb) v[0] ^= 0xe1;
  }
  return z;
}

/// GMAC's tag of `aad` given H = E_K(0) and E_K(J0): GHASH of the zero-padded data and the
/// length block, xored with E_K(J0).
Block reference_gmac(const Block& h, const Block& ek_j0, const std::vector<std::uint8_t>& aad) {
  Block y{};
  for (std::size_t at = 0; at < aad.size(); at += 16) {
    for (std::size_t j = 0; j < 16 && at + j < aad.size(); ++j) y[j] ^= aad[at + j];
    y = gf_mul(y, h);
  }
  const std::uint64_t bits = static_cast<std::uint64_t>(aad.size()) * 8;
  for (int j = 0; j < 8; ++j) y[7 - j] ^= static_cast<std::uint8_t>(bits >> (8 * j));
  y = gf_mul(y, h);  // the ciphertext length (the block's low half) is 0
  for (std::size_t j = 0; j < 16; ++j) y[j] ^= ek_j0[j];
  return y;
}

}  // namespace

TEST_CASE("GMAC: tags agree with GCM's published constants and a bitwise GHASH", "[unit][shared]") {
  // The GCM specification's test case 13 (AES-256, key and IV all zero, nothing to
  // authenticate): H = E_K(0) and the tag, which is E_K(J0).
  const Block h = from_hex("dc95c078a2408989ad48a21492842087");
  const Block ek_j0 = from_hex("530f8afbc74536b9a963b4f1c4cb738b");
  const std::array<std::byte, kGmacKeyBytes> zero_key{};
  OneTimeGmac gmac;
  std::mt19937_64 rng(20261204);
  for (const std::size_t n : {0, 1, 15, 16, 17, 64, 1000, 4096 + 3}) {
    std::vector<std::uint8_t> aad(n);
    for (auto& b : aad) b = static_cast<std::uint8_t>(rng());
    const GmacTag tag = gmac.of(zero_key, std::as_bytes(std::span(aad)));
    const Block want = reference_gmac(h, ek_j0, aad);
    INFO("bytes: " << n);
    CHECK(std::memcmp(tag.data(), want.data(), 16) == 0);
  }
}

TEST_CASE("Value MAC: every byte of name, header and payload changes the tag", "[unit][shared]") {
  const std::array<std::byte, 32> key{std::byte{7}};
  ValueMac mac(key);
  std::mt19937_64 rng(42);
  std::array<std::byte, kValueMacHeaderBytes> header{};
  std::vector<std::byte> payload(300);
  for (auto& b : header) b = static_cast<std::byte>(rng());
  for (auto& b : payload) b = static_cast<std::byte>(rng());
  std::string name = "kvo:{0123456789abcdef0123456789abcdef}:0";
  const GmacTag base = mac.tag(name, header, payload);
  CHECK(tag_equal(mac.tag(name, header, payload), base.data()));  // deterministic
  // Another value key: another tag.
  const std::array<std::byte, 32> other_key{std::byte{8}};
  CHECK_FALSE(tag_equal(ValueMac(other_key).tag(name, header, payload), base.data()));
  for (std::size_t i = 0; i < name.size(); ++i) {
    name[i] ^= 1;
    CHECK_FALSE(tag_equal(mac.tag(name, header, payload), base.data()));
    name[i] ^= 1;
  }
  CHECK_FALSE(tag_equal(mac.tag(name + "0", header, payload), base.data()));
  for (std::size_t i = 0; i < header.size(); ++i) {
    header[i] ^= std::byte{0x80};
    CHECK_FALSE(tag_equal(mac.tag(name, header, payload), base.data()));
    header[i] ^= std::byte{0x80};
  }
  for (std::size_t i = 0; i < payload.size(); ++i) {
    payload[i] ^= std::byte{1};
    CHECK_FALSE(tag_equal(mac.tag(name, header, payload), base.data()));
    payload[i] ^= std::byte{1};
  }
  // A payload cut short or extended with zeros (GHASH pads to 16 bytes: the length block
  // must tell them apart).
  payload.push_back(std::byte{0});
  CHECK_FALSE(tag_equal(mac.tag(name, header, payload), base.data()));
  payload.resize(288);
  CHECK_FALSE(tag_equal(mac.tag(name, header, payload), base.data()));
}

TEST_CASE("Value MAC: a known answer pins the format", "[unit][shared]") {
  // Computed outside this code base (Python's cryptography AESGCM and hmac, by a reviewer):
  // value key 07 00..00, this name, header bytes 0..79, payload i % 251 for i < 300. The
  // one-time key was 2f4af566d9a0d839970d053b672f0a750be7b26877a451b1e9b565bd8a88f1b0. A
  // change of byte order or input order would make engines of two builds miss each other's
  // values; this catches it.
  std::array<std::byte, 32> key{};
  key[0] = std::byte{7};
  std::array<std::byte, kValueMacHeaderBytes> header{};
  for (std::size_t i = 0; i < header.size(); ++i) header[i] = static_cast<std::byte>(i);
  std::vector<std::byte> payload(300);
  for (std::size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<std::byte>(i % 251);
  ValueMac mac(key);
  const GmacTag tag = mac.tag("kvo:{0123456789abcdef0123456789abcdef}:0", header, payload);
  const Block want = from_hex("ccd60df7818ca79613b29572622dd4c3");
  CHECK(std::memcmp(tag.data(), want.data(), 16) == 0);
}

TEST_CASE("tag_equal compares all 16 bytes", "[unit][shared]") {
  GmacTag tag{};
  for (std::size_t i = 0; i < tag.size(); ++i) tag[i] = static_cast<std::byte>(3 * i + 1);
  for (std::size_t i = 0; i < tag.size(); ++i) {
    GmacTag other = tag;
    other[i] ^= std::byte{0x40};
    INFO("byte " << i);
    CHECK_FALSE(tag_equal(tag, other.data()));
  }
  CHECK(tag_equal(tag, tag.data()));
}

TEST_CASE("fill_random: nonces differ", "[unit][shared]") {
  std::array<std::byte, 16> a{};
  std::array<std::byte, 16> b{};
  fill_random(a);
  fill_random(b);
  CHECK(a != b);
  CHECK(a != std::array<std::byte, 16>{});
}

}  // namespace kvoffload::detail
