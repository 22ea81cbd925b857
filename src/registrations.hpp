#pragma once

// Internal: which in-flight store jobs still read a GPU block (SEMANTICS 6.7 and 8). A block
// usually has one job; the lists are linked nodes in one pooled array, so registering and
// dropping allocate nothing in steady state.

#include <cstdint>
#include <vector>

#include "kvoffload/detail/flat_hash_map.hpp"
#include "kvoffload/types.hpp"

namespace kvoffload {

class Registrations {
 public:
  void add(GpuBlockId block, JobId job) {
    const std::int32_t node = new_node(job);
    auto [head, inserted] = heads_.insert(block, node);
    if (!inserted) {
      nodes_[static_cast<std::size_t>(node)].next = *head;
      *head = node;
    }
  }

  void remove(GpuBlockId block, JobId job) {
    std::int32_t* head = heads_.find(block);
    if (head == nullptr) return;
    std::int32_t prev = -1;
    for (std::int32_t n = *head; n >= 0; prev = n, n = nodes_[static_cast<std::size_t>(n)].next) {
      Node& node = nodes_[static_cast<std::size_t>(n)];
      if (node.job != job) continue;
      if (prev < 0) {
        *head = node.next;
      } else {
        nodes_[static_cast<std::size_t>(prev)].next = node.next;
      }
      node.next = free_;
      free_ = n;
      if (*head < 0) heads_.erase(block);
      return;
    }
  }

  template <class F>
  void for_each(GpuBlockId block, F&& f) const {
    const std::int32_t* head = heads_.find(block);
    if (head == nullptr) return;
    for (std::int32_t n = *head; n >= 0; n = nodes_[static_cast<std::size_t>(n)].next) {
      f(nodes_[static_cast<std::size_t>(n)].job);
    }
  }

  [[nodiscard]] bool empty() const noexcept { return heads_.empty(); }
  [[nodiscard]] std::size_t num_blocks() const noexcept { return heads_.size(); }

  void clear() {
    heads_.clear();
    nodes_.clear();
    free_ = -1;
  }

 private:
  struct Node {
    JobId job;
    std::int32_t next;
  };

  std::int32_t new_node(JobId job) {
    if (free_ >= 0) {
      const std::int32_t n = free_;
      free_ = nodes_[static_cast<std::size_t>(n)].next;
      nodes_[static_cast<std::size_t>(n)] = Node{job, -1};
      return n;
    }
    nodes_.push_back(Node{job, -1});
    return static_cast<std::int32_t>(nodes_.size() - 1);
  }

  detail::FlatHashMap<GpuBlockId, std::int32_t, detail::IntHash> heads_;
  std::vector<Node> nodes_;
  std::int32_t free_ = -1;
};

}  // namespace kvoffload
