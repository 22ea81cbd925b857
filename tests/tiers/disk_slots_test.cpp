// The disk tier's slot files: restart-safe index by header scan, checksums that turn torn or
// corrupt slots into misses, layouts kept apart, a process killed in the middle of writes.

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <span>

#include "kvoffload/error.hpp"
#include "kvoffload/host_block_manager.hpp"
#include "kvoffload/tiers/disk_slots.hpp"
#include "support/temp_dir.hpp"

using namespace kvoffload;
using Catch::Matchers::ContainsSubstring;

namespace {

using kvtest::TempDir;

Key key_of(int i) {
  std::uint8_t b[16] = {};
  for (int k = 0; k < 16; ++k) b[k] = static_cast<std::uint8_t>(i * 31 + k * 7 + 1);
  return Key{BlockHash::from_bytes(b), static_cast<std::uint32_t>(i % 3)};
}

/// Payload bytes that depend on the key only, so a reader can tell right from wrong.
std::vector<std::uint8_t> payload_of(int i, std::size_t n) {
  std::vector<std::uint8_t> p(n);
  std::mt19937 rng(static_cast<unsigned>(i) * 2654435761U + 17U);
  for (auto& b : p) b = static_cast<std::uint8_t>(rng());
  return p;
}

DiskSlotsConfig config_in(const std::filesystem::path& dir, std::uint64_t payload = 10000,
                          std::uint64_t slots = 20) {
  DiskSlotsConfig c;
  c.directory = dir.string();
  c.layout_digest = 0x1234abcd5678ef90ULL;
  c.payload_bytes = payload;
  c.capacity_bytes = slots * (4096 + (payload + 4095) / 4096 * 4096);
  c.slots_per_file = 8;  // several files
  return c;
}

void flip_byte(const std::string& file, std::uint64_t at) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  REQUIRE(f.good());
  f.seekg(static_cast<std::streamoff>(at));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x5a);
  f.seekp(static_cast<std::streamoff>(at));
  f.write(&c, 1);
}

}  // namespace

TEST_CASE("Disk slots: blocks written are found by a new process's scan and read back exactly",
          "[disk]") {
  TempDir dir;
  const DiskSlotsConfig c = config_in(dir.path);
  {
    DiskSlots d(c);
    CHECK(d.num_slots() == 20);
    CHECK(d.scan_report().valid == 0);
    CHECK(d.scan_report().empty == 20);
    for (int i = 0; i < 12; ++i) REQUIRE(d.write(i, key_of(i), 0, payload_of(i, c.payload_bytes)));
    REQUIRE(d.erase(3));  // evicted: gone after a restart
  }
  DiskSlots again(c);  // "restart"
  CHECK(again.scan_report().valid == 11);
  CHECK(again.scan_report().invalid == 0);
  for (int i = 0; i < 20; ++i) {
    const auto& k = again.scanned()[static_cast<std::size_t>(i)];
    CAPTURE(i);
    if (i < 12 && i != 3) {
      REQUIRE(k.has_value());
      CHECK(*k == key_of(i));
      std::vector<std::uint8_t> out(c.payload_bytes);
      REQUIRE(again.read(i, key_of(i), 0, out) == SlotRead::ok);
      CHECK(out == payload_of(i, c.payload_bytes));
    } else {
      CHECK_FALSE(k.has_value());
    }
  }
  // Asking a slot for another key is a miss, counted.
  std::vector<std::uint8_t> out(c.payload_bytes);
  CHECK(again.read(0, key_of(1), 0, out) == SlotRead::not_found);
  CHECK(again.stats().read_misses == 1);
}

TEST_CASE("Disk slots: a corrupt payload or header is a miss, never data", "[disk]") {
  TempDir dir;
  DiskSlotsConfig c = config_in(dir.path);
  std::string file;
  std::uint64_t slot_bytes = 0;
  {
    DiskSlots d(c);
    for (int i = 0; i < 4; ++i) REQUIRE(d.write(i, key_of(i), 0, payload_of(i, c.payload_bytes)));
    file = d.layout_directory() + "/slab-0.kvo";
    slot_bytes = d.slot_bytes();
  }
  flip_byte(file, 1 * slot_bytes + 4096 + 5000);  // slot 1's payload
  flip_byte(file, 2 * slot_bytes + 20);           // slot 2's header (the key)
  {
    DiskSlots d(c);  // the header-only scan still lists slot 1; its read catches the damage
    CHECK(d.scan_report().valid == 3);
    CHECK(d.scan_report().invalid == 1);
    CHECK_FALSE(d.scanned()[2].has_value());
    std::vector<std::uint8_t> out(c.payload_bytes);
    CHECK(d.read(1, key_of(1), 0, out) == SlotRead::corrupt);
    CHECK(d.read(2, key_of(2), 0, out) == SlotRead::corrupt);
    CHECK(d.stats().read_misses == 2);
    REQUIRE(d.read(0, key_of(0), 0, out) == SlotRead::ok);
    CHECK(out == payload_of(0, c.payload_bytes));
  }
  c.verify_payloads_on_scan = true;  // then the scan drops slot 1 as well
  DiskSlots verified(c);
  CHECK(verified.scan_report().valid == 2);
  CHECK(verified.scan_report().invalid == 2);
  CHECK_FALSE(verified.scanned()[1].has_value());
}

TEST_CASE("Disk slots: another layout never sees these bytes; a truncated file is a miss",
          "[disk]") {
  TempDir dir;
  DiskSlotsConfig c = config_in(dir.path);
  std::string file;
  {
    DiskSlots d(c);
    for (int i = 0; i < 10; ++i) REQUIRE(d.write(i, key_of(i), 0, payload_of(i, c.payload_bytes)));
    file = d.layout_directory() + "/slab-1.kvo";  // slots 8..15
  }
  DiskSlotsConfig other = c;
  other.layout_digest ^= 1;                // e.g. another tensor-parallel rank of the same engine
  other.keep_layouts = {c.layout_digest};  // its other ranks' directories are not stale
  {
    DiskSlots d(other);
    CHECK(d.scan_report().valid == 0);
    CHECK(d.layout_directory() != DiskSlots(c).layout_directory());
  }
  // Slots 8 and 9 lost, but for slot 8's first 100 bytes (its whole header).
  std::filesystem::resize_file(file, 100);
  {
    DiskSlots d(c);
    CHECK(d.scan_report().valid == 9);  // the header-only scan still lists slot 8 ...
    std::vector<std::uint8_t> out(c.payload_bytes);
    // ... whose read is a miss: the file grew back with zeros, so slot 8's payload fails its
    // checksum and slot 9 is empty.
    CHECK(d.read(8, key_of(8), 0, out) == SlotRead::corrupt);
    CHECK(d.read(9, key_of(9), 0, out) == SlotRead::not_found);
    REQUIRE(d.read(7, key_of(7), 0, out) == SlotRead::ok);
    CHECK(out == payload_of(7, c.payload_bytes));
  }
  c.verify_payloads_on_scan = true;
  CHECK(DiskSlots(c).scan_report().valid == 8);
}

TEST_CASE("Disk slots: bad configurations are refused by field", "[disk]") {
  TempDir dir;
  DiskSlotsConfig c = config_in(dir.path);
  c.capacity_bytes = 100;
  CHECK_THROWS_WITH(DiskSlots(c), ContainsSubstring("capacity_bytes"));
  c = config_in(dir.path);
  c.payload_bytes = 0;
  CHECK_THROWS_WITH(DiskSlots(c), ContainsSubstring("payload_bytes"));
  c = config_in(dir.path);
  c.directory = "/proc/kvoffload-cannot-be-here";
  CHECK_THROWS_AS(DiskSlots(c), error);
  c = config_in(dir.path);
  DiskSlots d(c);
  std::vector<std::uint8_t> small(10);
  CHECK_THROWS_WITH(d.write(0, key_of(0), 0, small), ContainsSubstring("payload of 10 bytes"));
  CHECK_THROWS_WITH(d.write(20, key_of(0), 0, payload_of(0, c.payload_bytes)),
                    ContainsSubstring("slot 20 is outside 0..19"));
}

TEST_CASE("Disk slots: a process killed while writing leaves only whole blocks", "[disk][fork]") {
  TempDir dir;
  DiskSlotsConfig c = config_in(dir.path, 64 * 1024, 400);
  int pipe_fds[2];
  REQUIRE(::pipe(pipe_fds) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // The child writes slots in order and reports each completed write.
    ::close(pipe_fds[0]);
    DiskSlots d(c);
    for (int i = 0; i < 400; ++i) {
      if (!d.write(i, key_of(i), 0, payload_of(i, c.payload_bytes))) ::_exit(3);
      if (::write(pipe_fds[1], &i, sizeof i) != sizeof i) ::_exit(4);
    }
    ::_exit(0);
  }
  ::close(pipe_fds[1]);
  std::set<int> completed;
  int i = 0;
  while (completed.size() < 40 && ::read(pipe_fds[0], &i, sizeof i) == sizeof i)
    completed.insert(i);
  ::kill(child, SIGKILL);  // in the middle of later writes
  int status = 0;
  ::waitpid(child, &status, 0);
  while (::read(pipe_fds[0], &i, sizeof i) == sizeof i) completed.insert(i);
  ::close(pipe_fds[0]);
  REQUIRE(completed.size() >= 40);

  c.verify_payloads_on_scan = true;
  DiskSlots d(c);
  INFO("child status " << status << ", " << completed.size() << " writes reported complete");
  // Every reported write is there; whatever else the scan found is whole (a write that
  // completed before the kill but after the last report); nothing else.
  std::vector<std::uint8_t> out(c.payload_bytes);
  std::int64_t found = 0;
  for (int s = 0; s < d.num_slots(); ++s) {
    const auto& k = d.scanned()[static_cast<std::size_t>(s)];
    if (completed.count(s) != 0) REQUIRE(k.has_value());
    if (!k.has_value()) continue;
    ++found;
    CAPTURE(s);
    REQUIRE(*k == key_of(s));
    REQUIRE(d.read(s, key_of(s), 0, out) == SlotRead::ok);
    REQUIRE(out == payload_of(s, c.payload_bytes));
  }
  CHECK(found >= static_cast<std::int64_t>(completed.size()));
}

TEST_CASE("A tier's index is a block manager restored from the slots' scan", "[disk][manager]") {
  TempDir dir;
  const DiskSlotsConfig c = config_in(dir.path, 4096, 6);
  {
    DiskSlots d(c);
    for (const int i : {0, 2, 3, 5})
      REQUIRE(d.write(i, key_of(i), 0, payload_of(i, c.payload_bytes)));
    REQUIRE(d.write(4, key_of(0), 0, payload_of(0, c.payload_bytes)));  // key 0 twice
  }
  DiskSlots d(c);
  ManagerConfig mc;
  mc.host_blocks = d.num_slots();
  HostBlockManager index(mc);
  CHECK(index.restore(d.scanned()) == 4);  // the second copy of key 0 is dropped
  for (const int i : {0, 2, 3, 5}) {
    CAPTURE(i);
    CHECK(index.peek(key_of(i)) == LookupResult::hit);
    CHECK(index.block_of(key_of(i)) == i);
  }
  CHECK(index.num_used() == 4);
  const auto events = index.take_events();
  REQUIRE(events.size() == 1);
  CHECK_FALSE(events[0].removed);
  CHECK(events[0].keys.size() == 4);
  // Three new keys, two free slots: the least recent restored key (slot 0) is evicted, and
  // the ids go out most recently freed first (SEMANTICS 9), then the free slots lowest first.
  PreparedStore p;
  REQUIRE(index.prepare_store(std::vector<Key>{key_of(10), key_of(11), key_of(12)}, p));
  CHECK(p.block_ids == std::vector<HostBlockId>{0, 1, 4});
  CHECK(index.peek(key_of(0)) == LookupResult::miss);
  // Only an empty manager can be restored.
  CHECK_THROWS_WITH(index.restore(d.scanned()), ContainsSubstring("already holds blocks"));
}

TEST_CASE(
    "Disk slots: a slot marked partly written or of format 1 is refused, even with a "
    "good checksum",
    "[disk]") {
  // Another writer (an older kvoffload, or a forger who recomputes the unkeyed header sum)
  // cannot make a slot holding a partly written block, or one written before the
  // written-sub-block rule, read back as a hit (SEMANTICS 6.8: tiers hold whole blocks only).
  TempDir dir;
  const DiskSlotsConfig c = config_in(dir.path);
  {
    DiskSlots d(c);
    for (int i = 0; i < 3; ++i) REQUIRE(d.write(i, key_of(i), 0, payload_of(i, c.payload_bytes)));
  }
  const std::uint64_t slot = 4096 + (c.payload_bytes + 4095) / 4096 * 4096;
  const std::string file = (dir.path / "1234abcd5678ef90" / "slab-0.kvo").string();
  const auto patch = [&](std::uint64_t at, std::size_t field, std::uint32_t value) {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    REQUIRE(f.good());
    std::uint8_t h[96];
    f.seekg(static_cast<std::streamoff>(at));
    f.read(reinterpret_cast<char*>(h), sizeof h);
    std::memcpy(h + field, &value, sizeof value);
    const std::uint64_t sum = disk_checksum(std::span<const std::uint8_t>(h, 88));
    std::memcpy(h + 88, &sum, sizeof sum);
    f.seekp(static_cast<std::streamoff>(at));
    f.write(reinterpret_cast<const char*>(h), sizeof h);
  };
  patch(0, 52, 1);         // slot 0: valid_from 1
  patch(slot, 8, 1);       // slot 1: format version 1
  patch(2 * slot, 52, 0);  // slot 2: rewritten unchanged (the patching itself is sound)
  DiskSlots d(c);
  CHECK(d.scan_report().valid == 1);
  CHECK(d.scan_report().invalid == 2);
  std::vector<std::uint8_t> out(c.payload_bytes);
  CHECK(d.read(0, key_of(0), 0, out) == SlotRead::corrupt);
  CHECK(d.read(1, key_of(1), 0, out) == SlotRead::corrupt);
  REQUIRE(d.read(2, key_of(2), 0, out) == SlotRead::ok);
  CHECK(out == payload_of(2, c.payload_bytes));
}

TEST_CASE("Disk slots: a block is found only under the weights' epoch it was written with",
          "[disk]") {
  // After new weights (reset_cache), or a restart that gives other weights, the slots of the
  // old ones are unreachable: a read under another epoch misses and the scan keeps them out
  // of the index, whatever the process did or did not clear before it died.
  TempDir dir;
  DiskSlotsConfig c = config_in(dir.path);
  c.epoch = 7;
  std::vector<std::uint8_t> out(c.payload_bytes);
  {
    DiskSlots d(c);
    REQUIRE(d.write(0, key_of(0), 7, payload_of(0, c.payload_bytes)));
    REQUIRE(d.write(1, key_of(1), 7, payload_of(1, c.payload_bytes)));
    REQUIRE(d.write(2, key_of(2), 8, payload_of(2, c.payload_bytes)));  // after reset_cache
    CHECK(d.read(0, key_of(0), 8, out) == SlotRead::not_found);
    REQUIRE(d.read(2, key_of(2), 8, out) == SlotRead::ok);
    CHECK(out == payload_of(2, c.payload_bytes));
  }
  {
    DiskSlots old_weights(c);  // a restart under epoch 7 (a read miss erases nothing here)
    CHECK(old_weights.scan_report().valid == 2);
    CHECK(old_weights.scan_report().other_epoch == 1);
    CHECK(old_weights.scanned()[1] == key_of(1));
    CHECK_FALSE(old_weights.scanned()[2].has_value());
  }
  c.epoch = 8;
  DiskSlots new_weights(c);
  CHECK(new_weights.scan_report().valid == 1);
  CHECK(new_weights.scan_report().other_epoch == 2);
  CHECK_FALSE(new_weights.scanned()[0].has_value());
  CHECK_FALSE(new_weights.scanned()[1].has_value());
  CHECK(new_weights.scanned()[2] == key_of(2));
  CHECK(new_weights.read(1, key_of(1), 8, out) == SlotRead::not_found);
  REQUIRE(new_weights.read(1, key_of(1), 7, out) ==
          SlotRead::ok);  // still there: only the epoch hid it
  CHECK(out == payload_of(1, c.payload_bytes));
}

TEST_CASE("Disk slots: a read says why it missed; a failed read leaves the slot as it was",
          "[disk]") {
  // Only a corrupt slot is a reason to erase it (the disk tier does, SlotRead::corrupt): a
  // read that failed (EIO, EAGAIN, a short read) may work the next time, and a well-formed
  // slot of another key or epoch is not the reader's to judge.
  TempDir dir;
  const DiskSlotsConfig c = config_in(dir.path);
  DiskSlots d(c);
  REQUIRE(d.write(0, key_of(0), 0, payload_of(0, c.payload_bytes)));
  std::vector<std::uint8_t> buffer(d.slot_bytes()), out(c.payload_bytes);
  const auto read_raw = [&](std::int64_t slot) {
    const SlotIo io = d.prepare_read(slot);
    REQUIRE(::pread(io.fd, buffer.data(), io.bytes, static_cast<off_t>(io.offset)) ==
            static_cast<ssize_t>(io.bytes));
  };
  // The read itself failed: a transient miss, nothing looked at, the slot kept.
  CHECK(d.finish_read(buffer.data(), false, key_of(0), 0, out) == SlotRead::io_error);
  CHECK(d.stats().read_errors == 1);
  CHECK(d.stats().read_misses == 1);
  REQUIRE(d.read(0, key_of(0), 0, out) == SlotRead::ok);
  CHECK(out == payload_of(0, c.payload_bytes));
  // The same bytes, checked for another key, another epoch: not found (not corrupt).
  read_raw(0);
  CHECK(d.finish_read(buffer.data(), true, key_of(0), 0, out) == SlotRead::ok);
  CHECK(d.finish_read(buffer.data(), true, key_of(1), 0, out) == SlotRead::not_found);
  CHECK(d.finish_read(buffer.data(), true, key_of(0), 5, out) == SlotRead::not_found);
  read_raw(3);  // never written
  CHECK(d.finish_read(buffer.data(), true, key_of(3), 0, out) == SlotRead::not_found);
  CHECK(d.stats().read_corrupt == 0);
  // A payload or header that fails its checksum: corrupt.
  read_raw(0);
  buffer[4096 + 7] ^= 1;
  CHECK(d.finish_read(buffer.data(), true, key_of(0), 0, out) == SlotRead::corrupt);
  read_raw(0);
  buffer[20] ^= 1;  // the key, under the header's checksum
  CHECK(d.finish_read(buffer.data(), true, key_of(0), 0, out) == SlotRead::corrupt);
  CHECK(d.stats().read_corrupt == 2);
  CHECK(d.stats().read_errors == 1);
  // None of it touched the slot.
  REQUIRE(d.read(0, key_of(0), 0, out) == SlotRead::ok);
  CHECK(out == payload_of(0, c.payload_bytes));
}

TEST_CASE(
    "Disk slots: a scan spread over threads finds every slot's state, across its ranges "
    "and files",
    "[disk]") {
  // 70,001 slots: 16 scan threads of 4,375 slots whose ranges end inside files of 1,000 slots;
  // sparse files (573 MB apparent) holding 400 headers. key_of() repeats every 768 keys, so
  // the per-slot key check is partial; "found where nothing valid was written" is exact.
  TempDir dir;
  DiskSlotsConfig c = config_in(dir.path, 4096, 70001);
  c.slots_per_file = 1000;
  c.epoch = 5;
  constexpr std::int64_t kSlots = 70001, kRange = kSlots / 16;
  const std::uint64_t slot_bytes = 8192;
  std::set<std::int64_t> valid, torn, other_epoch;
  std::string layout;
  {
    DiskSlots d(c);
    REQUIRE(d.num_slots() == kSlots);
    layout = d.layout_directory();
    std::mt19937_64 rng(51);
    std::set<std::int64_t> chosen{0, 999, 1000, kRange - 1, kRange, 2 * kRange, kSlots - 1};
    while (chosen.size() < 400) chosen.insert(static_cast<std::int64_t>(rng() % kSlots));
    int i = 0;
    for (const std::int64_t s : chosen) {
      const int kind = i++ % 5;  // 3 valid, 1 of other weights, 1 torn
      REQUIRE(d.write(s, key_of(static_cast<int>(s)), kind == 3 ? 4 : 5,
                      payload_of(static_cast<int>(s), c.payload_bytes)));
      (kind == 3 ? other_epoch : kind == 4 ? torn : valid).insert(s);
    }
  }
  for (const std::int64_t s : torn) {
    flip_byte(layout + "/slab-" + std::to_string(s / 1000) + ".kvo",
              static_cast<std::uint64_t>(s % 1000) * slot_bytes + 20);  // the key
  }
  DiskSlots again(c);
  const DiskScanReport& r = again.scan_report();
  CHECK(r.valid == static_cast<std::int64_t>(valid.size()));
  CHECK(r.invalid == static_cast<std::int64_t>(torn.size()));
  CHECK(r.other_epoch == static_cast<std::int64_t>(other_epoch.size()));
  CHECK(r.empty == kSlots - 400);
  REQUIRE(again.scanned().size() == static_cast<std::size_t>(kSlots));
  for (std::int64_t s = 0; s < kSlots; ++s) {
    const auto& k = again.scanned()[static_cast<std::size_t>(s)];
    if (valid.count(s) != 0) {
      CAPTURE(s);
      REQUIRE(k.has_value());
      REQUIRE(*k == key_of(static_cast<int>(s)));
    } else if (k.has_value()) {
      FAIL("slot " << s << " was not written under these weights, yet the scan found a key");
    }
  }
}
