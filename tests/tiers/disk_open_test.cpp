// Opening a disk tier's directory (issue 28): one owner per layout directory (a lock, also
// across processes), private modes and no symbolic links, the capacity enforced on the files
// already there, and stale layout directories under the root removed.

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "kvoffload/error.hpp"
#include "kvoffload/tiers/disk_slots.hpp"
#include "support/temp_dir.hpp"

using namespace kvoffload;
using Catch::Matchers::ContainsSubstring;
namespace fs = std::filesystem;

namespace {

using kvtest::TempDir;

constexpr std::uint64_t kPayload = 10000;
constexpr std::uint64_t kSlotBytes = 4096 + 12288;  // header + the payload padded to 4 KiB

Key key_of(int i) {
  std::uint8_t b[16] = {};
  for (int k = 0; k < 16; ++k) b[k] = static_cast<std::uint8_t>(i * 29 + k * 5 + 2);
  return Key{BlockHash::from_bytes(b), static_cast<std::uint32_t>(i % 3)};
}

std::vector<std::uint8_t> payload_of(int i) {
  std::vector<std::uint8_t> p(kPayload);
  std::mt19937 rng(static_cast<unsigned>(i) * 40503U + 5U);
  for (auto& b : p) b = static_cast<std::uint8_t>(rng());
  return p;
}

DiskSlotsConfig config_in(const fs::path& dir, std::uint64_t digest = 0x1234abcd5678ef90ULL,
                          std::uint64_t slots = 20) {
  DiskSlotsConfig c;
  c.directory = dir.string();
  c.layout_digest = digest;
  c.payload_bytes = kPayload;
  c.capacity_bytes = slots * kSlotBytes;
  c.slots_per_file = 8;  // several files
  return c;
}

std::string layout_of(const fs::path& root, std::uint64_t digest) {
  char name[17];
  std::snprintf(name, sizeof name, "%016llx", static_cast<unsigned long long>(digest));
  return (root / name).string();
}

unsigned mode_of(const fs::path& p) {
  struct stat st {};
  REQUIRE(::lstat(p.c_str(), &st) == 0);
  return st.st_mode & 0777;
}

std::string contents(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

void write_file(const fs::path& p, const std::string& text) {
  std::ofstream f(p, std::ios::binary);
  f << text;
}

}  // namespace

TEST_CASE("Disk slots: a second owner of a layout directory is refused, naming it", "[disk]") {
  TempDir dir;
  const DiskSlotsConfig c = config_in(dir.path);
  const std::string layout = layout_of(dir.path, c.layout_digest);
  std::vector<std::uint8_t> out(kPayload);
  {
    DiskSlots first(c);
    REQUIRE(first.layout_directory() == layout);
    REQUIRE(first.write(0, key_of(0), 0, payload_of(0)));
    // Two writers on one directory would overwrite each other's slots.
    CHECK_THROWS_AS(DiskSlots(c), io_error);
    CHECK_THROWS_WITH(DiskSlots(c), ContainsSubstring(layout) &&
                                        ContainsSubstring("another process or DiskTier") &&
                                        ContainsSubstring("its own path"));
    // The refused one touched nothing: the first still reads its slot.
    REQUIRE(first.read(0, key_of(0), 0, out) == SlotRead::ok);
    CHECK(out == payload_of(0));
    // Another layout under the same root is another directory, with a lock of its own.
    DiskSlotsConfig rank1 = config_in(dir.path, c.layout_digest ^ 1);
    rank1.keep_layouts = {c.layout_digest};
    CHECK_NOTHROW(DiskSlots(rank1));
  }
  DiskSlots again(c);  // the first is gone: its lock with it
  CHECK(again.scan_report().valid == 1);
}

TEST_CASE("Disk slots: a layout directory another process holds is refused until it exits",
          "[disk][fork]") {
  TempDir dir;
  const DiskSlotsConfig c = config_in(dir.path);
  int ready[2], go[2];
  REQUIRE(::pipe(ready) == 0);
  REQUIRE(::pipe(go) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // Opens the directory, says so, and holds it until the parent closes `go` (or dies).
    ::alarm(60);
    ::close(ready[0]);
    ::close(go[1]);
    int status = 0;
    try {
      DiskSlots d(c);
      if (!d.write(0, key_of(0), 0, payload_of(0))) status |= 1;
      const char x = 1;
      if (::write(ready[1], &x, 1) != 1) status |= 2;
      char y = 0;
      while (::read(go[0], &y, 1) > 0) {
      }
    } catch (...) {
      status |= 4;
    }
    ::_exit(status);
  }
  ::close(ready[1]);
  ::close(go[0]);
  char x = 0;
  const bool holding = ::read(ready[0], &x, 1) == 1;
  std::optional<std::string> refused;
  if (holding) {
    try {
      DiskSlots d(c);
    } catch (const io_error& e) {
      refused = e.what();
    }
  }
  ::close(go[1]);  // the child exits, releasing the lock
  ::close(ready[0]);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(holding);
  REQUIRE(refused.has_value());
  CHECK_THAT(*refused, ContainsSubstring(layout_of(dir.path, c.layout_digest)) &&
                           ContainsSubstring("another process"));
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  DiskSlots after(c);
  CHECK(after.scan_report().valid == 1);  // the child's block
}

TEST_CASE("Disk slots: directories 0700, files 0600, and symbolic links refused, not followed",
          "[disk]") {
  TempDir dir;
  const fs::path root = dir.path / "made" / "root";  // neither exists yet
  DiskSlotsConfig c = config_in(root);
  const fs::path layout = layout_of(root, c.layout_digest);
  { DiskSlots d(c); }
  CHECK(mode_of(dir.path / "made") == 0700);
  CHECK(mode_of(root) == 0700);
  CHECK(mode_of(layout) == 0700);
  CHECK(mode_of(layout / "kvoffload.lock") == 0600);
  for (const char* f : {"slab-0.kvo", "slab-1.kvo", "slab-2.kvo"}) {
    CAPTURE(f);
    CHECK(mode_of(layout / f) == 0600);
  }
  // Wider modes (an older version, a umask) are narrowed at open.
  fs::permissions(layout / "slab-1.kvo", fs::perms(0644));
  fs::permissions(layout / "kvoffload.lock", fs::perms(0666));
  fs::permissions(layout, fs::perms(0755));
  { DiskSlots d(c); }
  CHECK(mode_of(layout / "slab-1.kvo") == 0600);
  CHECK(mode_of(layout / "kvoffload.lock") == 0600);
  CHECK(mode_of(layout) == 0700);

  // A slab file that is a link to somewhere else: refused, and the target untouched.
  const fs::path target = dir.path / "precious";
  write_file(target, "not a slab file");
  fs::remove(layout / "slab-1.kvo");
  fs::create_symlink(target, layout / "slab-1.kvo");
  CHECK_THROWS_AS(DiskSlots(c), io_error);
  CHECK_THROWS_WITH(DiskSlots(c), ContainsSubstring((layout / "slab-1.kvo").string()) &&
                                      ContainsSubstring("symbolic link"));
  CHECK(contents(target) == "not a slab file");
  fs::remove(layout / "slab-1.kvo");
  // The lock file too.
  fs::remove(layout / "kvoffload.lock");
  fs::create_symlink(target, layout / "kvoffload.lock");
  CHECK_THROWS_WITH(DiskSlots(c),
                    ContainsSubstring("kvoffload.lock") && ContainsSubstring("symbolic link"));
  CHECK(contents(target) == "not a slab file");
  fs::remove(layout / "kvoffload.lock");
  CHECK_NOTHROW(DiskSlots(c));  // all real files again

  // A layout directory that is a link: refused, nothing written where it points.
  const fs::path elsewhere = dir.path / "elsewhere";
  fs::create_directory(elsewhere);
  fs::remove_all(layout);
  fs::create_directory_symlink(elsewhere, layout);
  CHECK_THROWS_WITH(DiskSlots(c),
                    ContainsSubstring(layout.string()) && ContainsSubstring("symbolic link"));
  CHECK(fs::is_empty(elsewhere));
  fs::remove(layout);

  // A root that is a link (with or without a trailing slash): refused.
  const fs::path link = dir.path / "root-link";
  fs::create_directory_symlink(root, link);
  for (const std::string& path : {link.string(), link.string() + "/"}) {
    CAPTURE(path);
    c.directory = path;
    CHECK_THROWS_WITH(DiskSlots(c),
                      ContainsSubstring(link.string()) && ContainsSubstring("symbolic link"));
  }
  CHECK_FALSE(fs::exists(layout));
}

TEST_CASE("Disk slots: a smaller capacity at open gives the space back, keeping what fits",
          "[disk]") {
  TempDir dir;
  DiskSlotsConfig c = config_in(dir.path, 0x1234abcd5678ef90ULL, 20);  // files of 8, 8, 4 slots
  {
    DiskSlots d(c);
    for (int i = 0; i < 20; ++i) REQUIRE(d.write(i, key_of(i), 0, payload_of(i)));
  }
  c.capacity_bytes /= 4;  // 5 slots: one file
  DiskSlots d(c);
  REQUIRE(d.num_slots() == 5);
  CHECK(d.scan_report().valid == 5);
  std::uint64_t apparent = 0, allocated = 0;
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(d.layout_directory())) {
    struct stat st {};
    REQUIRE(::lstat(e.path().c_str(), &st) == 0);
    names.push_back(e.path().filename().string());
    if (names.back() == "kvoffload.lock") continue;
    apparent += static_cast<std::uint64_t>(st.st_size);
    allocated += static_cast<std::uint64_t>(st.st_blocks) * 512;
  }
  INFO("files: " << names.size() << ", " << apparent << " bytes long, " << allocated
                 << " allocated, capacity " << c.capacity_bytes);
  CHECK(names.size() == 2);  // slab-0.kvo and the lock
  CHECK(apparent <= c.capacity_bytes);
  CHECK(allocated <= c.capacity_bytes);  // the lock file (empty) aside
  std::vector<std::uint8_t> out(kPayload);
  for (int i = 0; i < 5; ++i) {
    CAPTURE(i);
    REQUIRE(d.read(i, key_of(i), 0, out) == SlotRead::ok);
    CHECK(out == payload_of(i));
  }
}

TEST_CASE(
    "Disk slots: stale layout directories under the root are removed at open; one in use, "
    "one kept, or one holding other files stays",
    "[disk]") {
  TempDir dir;
  constexpr std::uint64_t kOld = 0x00000000000000a1ULL, kLive = 0x00000000000000b2ULL,
                          kRank = 0x00000000000000c3ULL, kNew = 0x00000000000000d4ULL;
  // Made by tiers that keep each other (as one engine's ranks would), so that none of them
  // removes another here.
  const auto keeping_all = [&](std::uint64_t digest) {
    DiskSlotsConfig c = config_in(dir.path, digest);
    c.keep_layouts = {kOld, kLive, kRank, kNew};
    return c;
  };
  for (const std::uint64_t digest : {kOld, kRank}) {
    DiskSlots d(keeping_all(digest));
    for (int i = 0; i < 4; ++i) REQUIRE(d.write(i, key_of(i), 0, payload_of(i)));
  }
  std::optional<DiskSlots> live(std::in_place, keeping_all(kLive));
  REQUIRE(live->write(0, key_of(0), 0, payload_of(0)));
  // Named like a layout but holding a file that is not ours, or a link: never removed.
  const fs::path notes = dir.path / "00000000000000e5";
  fs::create_directory(notes);
  write_file(notes / "notes.txt", "mine");
  const fs::path linked = dir.path / "00000000000000f6";
  fs::create_directory(linked);
  write_file(dir.path / "target", "keep me");
  fs::create_symlink(dir.path / "target", linked / "slab-0.kvo");
  // Not named like a layout: not looked at.
  fs::create_directory(dir.path / "other");
  write_file(dir.path / "other" / "slab-0.kvo", "x");

  REQUIRE(fs::exists(layout_of(dir.path, kOld)));
  CHECK(fs::exists(layout_of(dir.path, kRank)));
  DiskSlotsConfig now = config_in(dir.path, kNew);
  now.keep_layouts = {kRank};  // e.g. this engine's other tensor-parallel rank
  std::optional<DiskSlots> fresh(std::in_place, now);
  CHECK_FALSE(fs::exists(layout_of(dir.path, kOld)));  // stale: removed
  CHECK(fs::exists(layout_of(dir.path, kLive)));       // in use: kept
  CHECK(fs::exists(layout_of(dir.path, kRank)));       // kept by the config
  CHECK(fs::exists(layout_of(dir.path, kNew)));
  CHECK(contents(notes / "notes.txt") == "mine");
  CHECK(fs::is_symlink(linked / "slab-0.kvo"));
  CHECK(contents(dir.path / "target") == "keep me");
  CHECK(contents(dir.path / "other" / "slab-0.kvo") == "x");
  // The live one is untouched and still works.
  std::vector<std::uint8_t> out(kPayload);
  REQUIRE(live->read(0, key_of(0), 0, out) == SlotRead::ok);

  // Once it is closed, it is stale too at the next open.
  live.reset();
  fresh.reset();
  fresh.emplace(now);
  CHECK_FALSE(fs::exists(layout_of(dir.path, kLive)));
  CHECK(fs::exists(layout_of(dir.path, kRank)));
  CHECK(fresh->scan_report().valid == 0);
  // The kept rank's blocks are all there.
  fresh.reset();
  DiskSlots r(keeping_all(kRank));
  CHECK(r.scan_report().valid == 4);
  CHECK(fs::exists(layout_of(dir.path, kNew)));
}

TEST_CASE("Disk slots: a root, layout directory or file of another user is refused", "[disk]") {
  // Another local user who created the root first (a predictable path like /tmp/kv) could
  // swap the layout directory and plant a slab file of valid slots (the checksums are public):
  // a hit would serve their bytes. Only directories and files of this process's user, in a
  // root no one else may write, are used.
  TempDir dir;
  const fs::path root = dir.path / "root";
  DiskSlotsConfig c = config_in(root);
  const fs::path layout = layout_of(root, c.layout_digest);
  {
    DiskSlots d(c);
    REQUIRE(d.write(0, key_of(1), 0, payload_of(1)));
  }
  CHECK(DiskSlots(c).scanned()[0] == key_of(1));  // ours: restored

  // Writable by others: refused (this user's, but anyone could plant in it).
  fs::permissions(root, fs::perms(0777));
  CHECK_THROWS_WITH(DiskSlots(c),
                    ContainsSubstring(root.string()) && ContainsSubstring("writable by others"));
  fs::permissions(root, fs::perms(0700));
  CHECK_NOTHROW(DiskSlots(c));
  if (::geteuid() != 0) {
    SKIP("giving files to another user needs root (CI runs as root)");
  }
  constexpr uid_t kOther = 65534;  // nobody
  for (const fs::path& p : {root, layout, layout / "slab-0.kvo"}) {
    CAPTURE(p);
    REQUIRE(::chown(p.c_str(), kOther, kOther) == 0);
    CHECK_THROWS_WITH(DiskSlots(c), ContainsSubstring(p.string()) &&
                                        (ContainsSubstring("belongs to uid 65534") ||
                                         ContainsSubstring("belongs to another user")));
    REQUIRE(::chown(p.c_str(), ::geteuid(), ::getegid()) == 0);
  }
  CHECK(DiskSlots(c).scanned()[0] == key_of(1));  // all ours again
}
