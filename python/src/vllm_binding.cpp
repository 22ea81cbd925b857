// The vLLM connector's scheduler-side loops, in C++ (VllmBridge). vLLM calls the connector on
// its scheduler thread for every scheduled request every step; reading vLLM's own objects here
// (a request's block hashes, the scheduler output's per-request columns, the blocks it
// allocated) instead of converting them in Python keeps a running request's cost per step
// to a few attribute reads. A running request with no new block, no new hash and a token
// count inside the window where the scheduler would find it idle (Scheduler::idle_window,
// remembered from its last step that did something) is not passed at all. The attribute names are
// vLLM's (0.21 to 0.33): Request (request_id, block_hashes, num_tokens), SchedulerOutput
// (scheduled_new_reqs, scheduled_cached_reqs, num_scheduled_tokens, preempted_req_ids),
// NewRequestData (req_id, num_computed_tokens, block_ids), CachedRequestData (req_ids,
// num_computed_tokens, new_block_ids, resumed_req_ids), KVCacheBlocks (blocks) and KVCacheBlock
// (block_id, is_null, block_hash).

#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "bindings.hpp"
#include "kvoffload/enums.hpp"
#include "kvoffload/error.hpp"
#include "kvoffload/host_block_manager.hpp"
#include "kvoffload/scheduler.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace kvoffload::python {
namespace {

/// Python's warnings: the connector runs inside vLLM, whose log shows them.
void detail_warn_diverged(const std::string& id, std::int64_t keep_tokens) {
  const std::string text = "kvoffload: request \"" + id +
                           "\": its block hashes changed below what was stored for it (a "
                           "resumable session's next turn?); it stores nothing past token " +
                           std::to_string(keep_tokens) + " and loads nothing from now on";
  if (PyErr_WarnEx(PyExc_RuntimeWarning, text.c_str(), 1) < 0) PyErr_Clear();
}

struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept {
    return std::hash<std::string_view>{}(s);
  }
};

/// vLLM's attribute names, interned once: attr("...") would make a new string per read.
struct Names {
  nb::object request_id, block_hashes, num_tokens, blocks, block_id, is_null, block_hash,
      num_scheduled_tokens, scheduled_new_reqs, scheduled_cached_reqs, req_id, req_ids,
      num_computed_tokens, block_ids, new_block_ids, resumed_req_ids, preempted_req_ids, resumable,
      kv_cache_block_copies, dst_block_id, num_prompt_tokens;
  Names() {
    const auto intern = [](const char* s) { return nb::steal(PyUnicode_InternFromString(s)); };
    request_id = intern("request_id");
    block_hashes = intern("block_hashes");
    num_tokens = intern("num_tokens");
    blocks = intern("blocks");
    block_id = intern("block_id");
    is_null = intern("is_null");
    block_hash = intern("block_hash");
    num_scheduled_tokens = intern("num_scheduled_tokens");
    scheduled_new_reqs = intern("scheduled_new_reqs");
    scheduled_cached_reqs = intern("scheduled_cached_reqs");
    req_id = intern("req_id");
    req_ids = intern("req_ids");
    num_computed_tokens = intern("num_computed_tokens");
    block_ids = intern("block_ids");
    new_block_ids = intern("new_block_ids");
    resumed_req_ids = intern("resumed_req_ids");
    preempted_req_ids = intern("preempted_req_ids");
    resumable = intern("resumable");
    kv_cache_block_copies = intern("kv_cache_block_copies");
    dst_block_id = intern("dst_block_id");
    num_prompt_tokens = intern("num_prompt_tokens");
  }
};

/// obj.<name>; raises Python's AttributeError (as a C++ exception) when it has none.
nb::object get(nb::handle obj, const nb::object& name) {
  PyObject* v = PyObject_GetAttr(obj.ptr(), name.ptr());
  if (v == nullptr) throw nb::python_error();
  return nb::steal(v);
}

/// obj.<name>, or None when it has none.
nb::object get_or_none(nb::handle obj, const nb::object& name) {
  PyObject* v = PyObject_GetAttr(obj.ptr(), name.ptr());
  if (v == nullptr) {
    PyErr_Clear();
    return nb::none();
  }
  return nb::steal(v);
}

std::int64_t as_int(nb::handle h, const char* what) {
  const long long v = PyLong_AsLongLong(h.ptr());
  if (v == -1 && PyErr_Occurred() != nullptr) {
    PyErr_Clear();
    throw invalid_argument(std::string("vLLM: ") + what + " is not an integer");
  }
  return v;
}

GpuBlockId as_block_id(nb::handle h, const char* what) {
  const std::int64_t v = as_int(h, what);
  if (v < std::numeric_limits<GpuBlockId>::min() || v > std::numeric_limits<GpuBlockId>::max()) {
    throw invalid_argument(std::string("vLLM: ") + what + " " + std::to_string(v) +
                           " is out of range for a GPU block id");
  }
  return static_cast<GpuBlockId>(v);
}

std::string_view as_str(nb::handle h, const char* what) {
  Py_ssize_t n = 0;
  const char* s = PyUnicode_Check(h.ptr()) ? PyUnicode_AsUTF8AndSize(h.ptr(), &n) : nullptr;
  if (s == nullptr) {
    PyErr_Clear();
    throw invalid_argument(std::string("vLLM: ") + what + " is not a string");
  }
  return {s, static_cast<std::size_t>(n)};
}

/// A list or tuple (or any sequence, copied once) read by index without a call per item.
class Fast {
 public:
  Fast(nb::handle seq, const char* what) : seq_(nb::steal(PySequence_Fast(seq.ptr(), what))) {
    if (!seq_.is_valid()) throw nb::python_error();
  }
  [[nodiscard]] Py_ssize_t size() const noexcept { return PySequence_Fast_GET_SIZE(seq_.ptr()); }
  nb::handle operator[](Py_ssize_t i) const noexcept {
    return PySequence_Fast_GET_ITEM(seq_.ptr(), i);
  }

 private:
  nb::object seq_;
};

BlockHash to_block_hash(nb::handle h, std::string_view request, std::size_t i) {
  nb::object bytes = nb::borrow(h);
  if (!PyBytes_Check(h.ptr())) bytes = nb::steal(PyObject_Bytes(h.ptr()));
  if (!bytes.is_valid()) throw nb::python_error();
  const auto n = static_cast<std::size_t>(PyBytes_GET_SIZE(bytes.ptr()));
  if (n < 1 || n > BlockHash::max_size) {
    throw invalid_argument("request \"" + std::string(request) + "\": block hash " +
                           std::to_string(i) + " has " + std::to_string(n) + " bytes (1 to 32)");
  }
  return BlockHash::from_bytes(
      std::span(reinterpret_cast<const std::uint8_t*>(PyBytes_AS_STRING(bytes.ptr())), n));
}

class VllmBridge {
 public:
  /// `stale_session_hashes`: the engine is a vLLM before 0.32, whose streaming sessions keep
  /// the block hashes over the tokens a next turn drops (check_session_turn).
  VllmBridge(Scheduler& s, std::vector<std::int64_t> gpu_block_sizes,
             bool stale_session_hashes = false)
      : s_(s), sizes_(std::move(gpu_block_sizes)), stale_session_hashes_(stale_session_hashes) {
    for (const GroupConfig& g : s_.config().groups)
      has_mamba_ = has_mamba_ || g.kind == GroupKind::mamba;
  }

  /// get_num_new_matched_tokens: the request's new hashes and token count, then the lookup.
  /// `load_limit`: vLLM's max_load_tokens (negative: none), applied inside the lookup;
  /// `store_limit`: its max_offload_tokens (negative: left as it is). Both here, where the
  /// request's idle window is dropped: a new store limit moves it. `continues`: the
  /// "kvoffload_continues" hint (1, 0; -1 none).
  std::optional<std::int64_t> lookup(nb::handle request, std::int64_t num_computed_tokens,
                                     std::int64_t load_limit, std::int64_t store_limit,
                                     int continues) {
    // SEMANTICS 6.10: mamba blocks are stored only within the tokens vLLM computes as a prefill
    // (its scheduler's prefill_end: the prompt, or what a resumed request recomputes). Read
    // before the request is registered, so a request without them changes nothing.
    std::int64_t final_tokens = -1;
    if (has_mamba_) {
      const std::int64_t prompt = as_int(get(request, n_.num_prompt_tokens), "num_prompt_tokens");
      const std::int64_t tokens = as_int(get(request, n_.num_tokens), "num_tokens");
      final_tokens = std::max<std::int64_t>(0, std::max(prompt, tokens - 1));
    }
    Entry& e = sync(request, /*always=*/true);
    if (final_tokens >= 0) s_.limit_state_stores(e.id, final_tokens);
    if (!e.diverged) {  // a diverged request keeps the limits sync_entry gave it
      if (load_limit >= 0 || e.load_limited) s_.limit_loads(e.id, load_limit);
      e.load_limited = load_limit >= 0;
      if (store_limit >= 0) s_.limit_stores(e.id, store_limit);
    }
    // kv_transfer_params "kvoffload_continues" (policy reuse's hint; -1: not given).
    if (continues >= 0) s_.hint_continues(e.id, continues == 1);
    e.local = num_computed_tokens;
    e.window_valid = false;
    return s_.lookup(e.id, num_computed_tokens);
  }

  /// update_state_after_alloc: each group's blocks and how many lead with computed (or null)
  /// blocks, as the scheduler's on_allocated wants them.
  void allocated(std::string_view request_id, nb::handle kv_blocks,
                 std::int64_t num_external_tokens) {
    const auto it = requests_.find(request_id);
    const std::int64_t local = it == requests_.end() ? 0 : it->second.local;
    if (it != requests_.end()) it->second.window_valid = false;
    nb::object groups = get(kv_blocks, n_.blocks);
    std::vector<AllocatedGroup> alloc;
    std::size_t g = 0;
    for (nb::handle group : groups) {
      if (g >= sizes_.size()) {
        throw invalid_argument("request \"" + std::string(request_id) + "\": vLLM allocated " +
                               std::to_string(nb::len(groups)) + " groups, the model has " +
                               std::to_string(sizes_.size()));
      }
      const Fast items(group, "KVCacheBlocks.blocks");
      const auto n = static_cast<std::int64_t>(items.size());
      const std::int64_t size = sizes_[g];
      const std::int64_t needed = (local + num_external_tokens + size - 1) / size;
      std::int64_t computed = std::min(needed, n);
      // Blocks below the locally computed tokens need no load whatever they hold: a window or
      // mamba group may keep non-null unhashed blocks there (vLLM 0.33 scans from here too).
      const std::int64_t first_fresh = (local + size - 1) / size;
      AllocatedGroup a;
      a.block_ids.resize(static_cast<std::size_t>(n));
      for (std::int64_t i = 0; i < n; ++i) {
        nb::handle b = items[static_cast<Py_ssize_t>(i)];
        a.block_ids[static_cast<std::size_t>(i)] = as_block_id(get(b, n_.block_id), "block_id");
        // The first block vLLM neither computed nor holds as null: loads start there.
        if (i >= first_fresh && i < computed && !nb::cast<bool>(get(b, n_.is_null)) &&
            get(b, n_.block_hash).is_none()) {
          computed = i;
        }
      }
      a.num_computed_blocks = computed;
      alloc.push_back(std::move(a));
      ++g;
    }
    s_.on_allocated(request_id, alloc, num_external_tokens);
  }

  /// build_connector_meta: the scheduler output's requests, their new hashes first.
  nb::tuple build_step(nb::handle out) {
    const std::size_t G = sizes_.size();
    nb::object scheduled = get(out, n_.num_scheduled_tokens);
    const auto num_scheduled = [&](nb::handle rid) {
      PyObject* v =
          PyDict_Check(scheduled.ptr()) ? PyDict_GetItem(scheduled.ptr(), rid.ptr()) : nullptr;
      if (v == nullptr) {
        throw invalid_argument("request \"" + std::string(as_str(rid, "req_id")) +
                               "\": not in num_scheduled_tokens");
      }
      return as_int(v, "num_scheduled_tokens");
    };
    nb::object new_reqs = get(out, n_.scheduled_new_reqs);
    nb::object cached = get(out, n_.scheduled_cached_reqs);
    nb::object ids = get(cached, n_.req_ids);
    nb::object computed = get(cached, n_.num_computed_tokens);
    nb::object new_blocks = get(cached, n_.new_block_ids);
    nb::object resumed = get_or_none(cached, n_.resumed_req_ids);
    used_ = 0;
    passed_.clear();
    for (nb::handle nr : new_reqs) {
      nb::object rid = get(nr, n_.req_id);
      const std::string_view id = as_str(rid, "req_id");
      const std::int64_t computed_tokens =
          as_int(get(nr, n_.num_computed_tokens), "num_computed_tokens");
      const std::int64_t scheduled_tokens = num_scheduled(rid);
      if (Entry* e = known(id)) {
        check_session_turn(*e, computed_tokens);  // before its new hashes are read
        sync_entry(*e, false, false);
        e->scheduled_end = computed_tokens + scheduled_tokens;
        passed_.push_back(e);
      }
      // A new request's block_ids are its whole block table: the scheduler's list starts over
      // (resumed). A request the scheduler knows can come back this way: a resumable
      // session's next turn (vLLM re-queues it with its table and no lookup), or a preempted
      // one under vLLM 0.33's model runner; appending would store other blocks' bytes.
      fill(next_entry(G), id, computed_tokens, scheduled_tokens, get(nr, n_.block_ids), true,
           "block_ids");
    }
    const Fast id_col(ids, "req_ids");
    const Fast computed_col(computed, "num_computed_tokens");
    const Fast blocks_col(new_blocks, "new_block_ids");
    const Py_ssize_t n = id_col.size();
    if (computed_col.size() != n || blocks_col.size() != n) {
      throw invalid_argument("vLLM: scheduled_cached_reqs has columns of different lengths");
    }
    const bool any_resumed = !resumed.is_none() && nb::len(resumed) > 0;
    for (Py_ssize_t i = 0; i < n; ++i) {
      nb::handle rid = id_col[i];
      const std::string_view id = as_str(rid, "req_id");
      bool was_resumed = false;
      if (any_resumed) {
        const int found = PySequence_Contains(resumed.ptr(), rid.ptr());
        if (found < 0) throw nb::python_error();
        was_resumed = found == 1;
      }
      const std::int64_t computed_tokens = as_int(computed_col[i], "num_computed_tokens");
      const std::int64_t scheduled_tokens = num_scheduled(rid);
      nb::handle fresh = blocks_col[i];
      if (Entry* e = known(id)) {
        const bool grew = sync_entry(*e, false, false);
        // Most of a decode step: nothing new for the scheduler, which would find it idle.
        const std::int64_t x = computed_tokens + scheduled_tokens;
        e->scheduled_end = x;
        if (!grew && !was_resumed && fresh.is_none() && e->window_valid && x >= e->window.lo &&
            x < e->window.hi) {
          ++skipped_;
          continue;
        }
        passed_.push_back(e);
      }
      fill(next_entry(G), id, computed_tokens, scheduled_tokens, fresh, was_resumed,
           "new_block_ids");
    }
    std::vector<std::string> preempted;
    nb::object p = get_or_none(out, n_.preempted_req_ids);
    if (!p.is_none()) {
      for (nb::handle rid : p) preempted.emplace_back(as_str(rid, "preempted_req_ids"));
    }
    // vLLM's copy-on-write block copies write their destinations this step, which no request's
    // new_block_ids may show: a store of an earlier holder must leave them out (SEMANTICS 6.9;
    // vLLM's own connector counts them as this step's allocations too).
    nb::object copies = get_or_none(out, n_.kv_cache_block_copies);
    if (!copies.is_none()) {
      handed_out_.clear();
      for (nb::handle c : copies) {
        handed_out_.push_back(as_block_id(get(c, n_.dst_block_id), "dst_block_id"));
      }
      s_.handed_out(handed_out_);
    }
    entries_passed_ += used_;
    StepResult r;
    try {
      r = s_.build_step(std::span(entries_.data(), used_), preempted);
    } catch (...) {
      for (auto& [id, e] : requests_) e.window_valid = false;
      throw;
    }
    // The passed requests' idle windows as the step left them.
    for (Entry* e : passed_) {
      e->window = s_.idle_window(e->id);
      e->window_valid = true;
    }
    return step_to_tuple(std::move(r));
  }

  /// request_finished: forgets the request; false if it was never looked up.
  bool finished(std::string_view request_id) {
    const auto it = requests_.find(request_id);
    if (it == requests_.end()) return false;
    s_.on_finished(request_id);
    requests_.erase(it);
    return true;
  }

  /// take_events for vLLM's KV events: [(removed, medium, group, [hash bytes])], consecutive
  /// events of one kind and medium merged, then split by group (first seen first). A host
  /// store of a block held without its leading sub-blocks (SEMANTICS 6.8) is left out (a
  /// router must not take it for a whole block), as are a shared tier's removals (this
  /// engine's index forgetting a key is no news of the cluster). kvoffload.vllm.event_groups
  /// is the same in Python.
  nb::list events() {
    nb::list out;
    const std::vector<ManagerEvent> events = s_.take_events();
    std::vector<std::pair<std::uint32_t, nb::list>> groups;
    for (std::size_t i = 0; i < events.size();) {
      const bool removed = events[i].removed;
      const Medium medium = events[i].medium;
      groups.clear();
      for (; i < events.size() && events[i].removed == removed && events[i].medium == medium; ++i) {
        if (removed && medium == Medium::shared) continue;
        for (const Key& k : events[i].keys) {
          if (!removed && medium == Medium::host) {
            std::uint16_t valid_from = 0;
            if (s_.manager().peek(k, valid_from) != LookupResult::miss && valid_from > 0) continue;
          }
          auto g = std::find_if(groups.begin(), groups.end(),
                                [&](const auto& p) { return p.first == k.group; });
          if (g == groups.end()) g = groups.insert(groups.end(), {k.group, nb::list()});
          g->second.append(nb::bytes(reinterpret_cast<const char*>(k.hash.data()), k.hash.size()));
        }
      }
      const std::string name(to_string(medium));
      for (auto& [group, hashes] : groups) {
        out.append(nb::make_tuple(removed, name, group, hashes));
      }
    }
    return out;
  }

  [[nodiscard]] std::size_t size() const noexcept { return requests_.size(); }
  /// (entries passed to the scheduler, entries left out as idle) since construction.
  [[nodiscard]] std::pair<std::uint64_t, std::uint64_t> counts() const noexcept {
    return {entries_passed_, skipped_};
  }
  /// After the scheduler's reset_cache: every remembered idle window is void.
  void invalidate() {
    for (auto& [id, e] : requests_) e.window_valid = false;
  }

 private:
  struct Entry {
    std::string id;
    nb::object request;  // vLLM's Request: its block_hashes grow as tokens arrive
    nb::object hashes;   // its block_hashes list (extended in place), read again at lookups
    Scheduler::IdleWindow window;  // Scheduler::idle_window after its last passed step
    bool window_valid = false;
    bool load_limited = false;     // a load limit was given (one less call when never)
    std::vector<BlockHash> given;  // the hashes the scheduler has, as it was given them
    // hashes[given.size() - 1] when last read (a strong reference: the object stays what it
    // was), so a step finds an unchanged list by one length and one pointer compare.
    nb::object last_given;
    bool diverged = false;            // its hashes stopped extending what was given (sync_entry)
    std::int64_t local = 0;           // num_computed_tokens at the last lookup
    std::int64_t scheduled_end = -1;  // computed + scheduled tokens of its last step
  };

  std::vector<GpuBlockId> handed_out_;  // build_step: this step's copy destinations

  ScheduledRequest& next_entry(std::size_t G) {
    if (used_ == entries_.size()) entries_.emplace_back();
    ScheduledRequest& e = entries_[used_++];
    e.new_block_ids.resize(G);
    return e;
  }

  /// An entry's fields; `groups` is None (no new block) or one sequence of ids per group.
  static void fill(ScheduledRequest& e, std::string_view id, std::int64_t computed,
                   std::int64_t scheduled, nb::handle groups, bool resumed, const char* what) {
    e.request_id.assign(id);
    e.num_computed_tokens = computed;
    e.num_scheduled_tokens = scheduled;
    e.resumed = resumed;
    for (auto& g : e.new_block_ids) g.clear();
    if (groups.is_none()) return;
    const Fast per_group(groups, what);
    if (static_cast<std::size_t>(per_group.size()) != e.new_block_ids.size()) {
      // The scheduler names the request and the counts.
      e.new_block_ids.resize(static_cast<std::size_t>(per_group.size()));
    }
    for (Py_ssize_t g = 0; g < per_group.size(); ++g) {
      const Fast ids(per_group[g], what);
      std::vector<GpuBlockId>& out = e.new_block_ids[static_cast<std::size_t>(g)];
      out.resize(static_cast<std::size_t>(ids.size()));
      for (Py_ssize_t i = 0; i < ids.size(); ++i) {
        out[static_cast<std::size_t>(i)] = as_block_id(ids[i], what);
      }
    }
  }

  /// Gives the scheduler the request's hashes it has not seen. `always`: also its token count
  /// when no hash is new (a lookup reads it); a step needs it only with a new hash, since a
  /// block is offloadable only once hashed.
  Entry& sync(nb::handle request, bool always) {
    nb::object rid = get(request, n_.request_id);
    const std::string_view id = as_str(rid, "request_id");
    auto it = requests_.find(id);
    const bool first = it == requests_.end();
    if (first) {
      it = requests_.emplace(std::string(id), Entry{std::string(id), nb::borrow(request)}).first;
    } else if (!it->second.request.is(request)) {
      // Another object under a live id (vLLM forbids it; a caller may not): read the new one.
      it->second.request = nb::borrow(request);
      it->second.hashes = nb::object();
    }
    Entry& e = it->second;
    try {
      sync_entry(e, first, always);
    } catch (...) {
      if (first) requests_.erase(it);  // the scheduler never took it: no entry either
      throw;
    }
    return e;
  }

  Entry* known(std::string_view id) {
    const auto it = requests_.find(id);
    return it == requests_.end() ? nullptr : &it->second;
  }

  /// Whether the scheduler's view of the request changed (hashes or token count given).
  bool sync_entry(Entry& e, bool first, bool always) {
    if (!always && !first && !e.diverged && e.hashes.is_valid() &&
        PyList_CheckExact(e.hashes.ptr())) {
      // Most of a step's requests: no new hash, the last one given still in its place (the
      // same immutable object, so the same bytes; vLLM chains its hashes, so the ones before
      // it are unchanged too). Anything else takes the full check below.
      const Py_ssize_t len = PyList_GET_SIZE(e.hashes.ptr());
      if (static_cast<std::size_t>(len) == e.given.size() &&
          (len == 0 || PyList_GET_ITEM(e.hashes.ptr(), len - 1) == e.last_given.ptr())) {
        return false;
      }
    }
    if (always || !e.hashes.is_valid()) e.hashes = get(e.request, n_.block_hashes);
    const nb::object& hashes = e.hashes;
    const Py_ssize_t len = PyList_CheckExact(hashes.ptr()) ? PyList_GET_SIZE(hashes.ptr())
                                                           : PyObject_Length(hashes.ptr());
    if (len < 0) throw nb::python_error();
    const auto n = static_cast<std::size_t>(len);
    if (e.diverged) return false;
    // The list must still extend what the scheduler has: the last hash given unchanged (vLLM
    // chains its hashes, so the ones before it are too). A resumable session's next turn
    // drops and re-derives trailing hashes from other tokens.
    const std::size_t g = e.given.size();
    if (!first && g > 0 &&
        (n < g || !same_hash(Fast(hashes, "block_hashes")[static_cast<Py_ssize_t>(g - 1)],
                             e.given.back()))) {
      diverge(e, hashes, n);
      return true;
    }
    if (!first && !always && n <= g) {  // n == g: nothing new (equal bytes, another object?)
      remember_last(e, hashes, n);
      return false;
    }
    const std::int64_t num_tokens = as_int(get(e.request, n_.num_tokens), "num_tokens");
    std::vector<BlockHash> fresh;
    fresh.reserve(n > g ? n - g : 0);
    if (n > g || first) {
      const Fast items(hashes, "block_hashes");
      for (std::size_t i = first ? 0 : g; i < n; ++i) {
        fresh.push_back(to_block_hash(items[static_cast<Py_ssize_t>(i)], e.id, i));
      }
    }
    if (first) {
      s_.update_request(e.id, num_tokens, fresh);
    } else {
      s_.extend_request(e.id, num_tokens, fresh);
    }
    e.given.insert(e.given.end(), fresh.begin(), fresh.end());
    remember_last(e, hashes, n);
    e.window_valid = false;
    return true;
  }

  /// e.last_given = hashes[n - 1], the object of the last hash given (given.size() == n):
  /// what the fast path of sync_entry compares with.
  static void remember_last(Entry& e, const nb::object& hashes, std::size_t n) {
    e.last_given = n == 0
                       ? nb::object()
                       : nb::borrow(Fast(hashes, "block_hashes")[static_cast<Py_ssize_t>(n - 1)]);
  }

  static bool same_hash(nb::handle h, const BlockHash& known) {
    if (!PyBytes_Check(h.ptr())) return false;  // vLLM's are bytes; anything else: diverged
    const auto n = static_cast<std::size_t>(PyBytes_GET_SIZE(h.ptr()));
    return n == known.size() && std::memcmp(PyBytes_AS_STRING(h.ptr()), known.data(), n) == 0;
  }

  /// The request's hashes no longer extend the scheduler's: its blocks past the hashes both
  /// still share hold other tokens than the scheduler's keys name. It stores nothing past
  /// them and loads nothing from now on (the scheduler's keys there would be wrong: a load
  /// could bring KV of tokens the request no longer has).
  void diverge(Entry& e, const nb::object& hashes, std::size_t n) {
    const Fast items(hashes, "block_hashes");
    std::size_t keep = 0;
    while (keep < std::min(n, e.given.size()) &&
           same_hash(items[static_cast<Py_ssize_t>(keep)], e.given[keep])) {
      ++keep;
    }
    diverge_at(e, static_cast<std::int64_t>(keep) * s_.config().hash_block_size);
  }

  /// vLLM before 0.32 starts a streaming session's next turn by dropping the tokens past the
  /// computed ones (`computed`, this turn's num_computed_tokens: the sampled token, and with
  /// speculative decoding what the last step scheduled past it) but keeps any block hash over
  /// them, and chains the next turn's hashes from it: those name tokens the request no longer
  /// has, and the content check of sync_entry cannot tell (the list only grew). If a block
  /// boundary lies among the tokens it may have dropped (up to the last step's end and the
  /// sampled token after it), a resumable request stores nothing past its computed whole
  /// blocks and loads nothing from then on. vLLM 0.32 and later cut those hashes and derive
  /// them again, which sync_entry checks.
  void check_session_turn(Entry& e, std::int64_t computed) {
    const std::int64_t end = e.scheduled_end;
    const std::int64_t hbs = s_.config().hash_block_size;
    if (!stale_session_hashes_ || e.diverged || end < 0) return;
    if ((std::max(computed, end) + 1) / hbs == computed / hbs) return;  // no block boundary
    const int resumable = PyObject_IsTrue(get_or_none(e.request, n_.resumable).ptr());
    if (resumable < 0) throw nb::python_error();
    if (resumable == 0) return;
    diverge_at(e, computed / hbs * hbs);
  }

  /// Stores nothing past `keep_tokens`, loads nothing from now on, reads no more hashes.
  void diverge_at(Entry& e, std::int64_t keep_tokens) {
    s_.limit_stores(e.id, keep_tokens);
    s_.limit_loads(e.id, 0);
    e.diverged = true;
    e.window_valid = false;
    detail_warn_diverged(e.id, keep_tokens);
  }

  Names n_;
  Scheduler& s_;
  std::vector<std::int64_t> sizes_;    // each group's GPU block size
  bool stale_session_hashes_ = false;  // check_session_turn
  bool has_mamba_ = false;             // a mamba group: lookups set the final tokens
  std::unordered_map<std::string, Entry, StringHash, std::equal_to<>> requests_;
  // build_step's entries: the first used_ are this step's. Kept between steps, so a step
  // reuses their strings' and vectors' memory instead of allocating per request.
  std::vector<ScheduledRequest> entries_;
  std::size_t used_ = 0;
  std::vector<Entry*> passed_;  // the known requests in this step's entries
  std::uint64_t skipped_ = 0;   // entries left out as idle, since construction
  std::uint64_t entries_passed_ = 0;
};

}  // namespace

void bind_vllm(nb::module_& m) {
  nb::class_<VllmBridge>(m, "VllmBridge",
                         "The vLLM connector's scheduler-side calls, reading vLLM's objects "
                         "in C++ (python/src/vllm_binding.cpp).")
      .def(nb::init<Scheduler&, std::vector<std::int64_t>, bool>(), "scheduler"_a,
           "gpu_block_sizes"_a, "stale_session_hashes"_a = false, nb::keep_alive<1, 2>())
      .def("lookup", &VllmBridge::lookup, "request"_a, "num_computed_tokens"_a, "load_limit"_a = -1,
           "store_limit"_a = -1, "continues"_a = -1)
      .def("allocated", &VllmBridge::allocated, "request_id"_a, "blocks"_a, "num_external_tokens"_a)
      .def("build_step", &VllmBridge::build_step, "scheduler_output"_a)
      .def("finished", &VllmBridge::finished, "request_id"_a)
      .def("events", &VllmBridge::events)
      .def("invalidate", &VllmBridge::invalidate)
      .def_prop_ro("counts", &VllmBridge::counts)
      .def("__len__", &VllmBridge::size);
}

}  // namespace kvoffload::python
