#pragma once
/// A tournament (winner) tree per group over dense member indices: each member
/// belongs to one group and holds an integer key; update() replays the
/// member's path in its group's tree, O(log n), and winner() reads the
/// group's member with the largest key in O(1), ties to the lower member. No
/// allocation after reset(). cycle_policy keeps one tree per expert byte size
/// over its layers' keys K (moe_residency/cache/cycle.hpp).

#include <cstddef>
#include <cstdint>
#include <vector>

namespace moe_residency {
namespace detail {

class cache_tournament {
 public:
  /// Builds one tree per group, group_of[m] the group (< n_groups) of member m;
  /// every key is 0. Each group must have at least one member.
  void reset(const std::vector<std::uint32_t>& group_of, std::size_t n_groups) {
    const std::size_t n_members = group_of.size();
    group_of_ = group_of;
    // A tree per group over its members, ascending: node i's children are
    // 2i and 2i + 1, leaves at [P, 2P), each node holds the member with the
    // largest key below it (ties to the left, the lower member).
    leaf_of_.assign(n_members, 0);
    root_.assign(n_groups, 0);
    tree_.clear();
    for (std::size_t c = 0; c < n_groups; ++c) {
      std::uint32_t n = 0;
      for (std::size_t l = 0; l < n_members; ++l)
        if (group_of_[l] == c) ++n;
      std::uint32_t p = 1;
      while (p < n) p *= 2;
      const auto off = static_cast<std::uint32_t>(tree_.size());
      root_[c] = off + 1;
      tree_.resize(tree_.size() + 2 * p, node{0, static_cast<std::uint32_t>(n_members)});  // padding
      n = 0;
      for (std::size_t l = 0; l < n_members; ++l)
        if (group_of_[l] == c) {
          leaf_of_[l] = off + p + n++;
          tree_[leaf_of_[l]].member = static_cast<std::uint32_t>(l);
        }
      for (std::uint32_t i = p; i-- > 1;) tree_[off + i] = tree_[off + 2 * i];  // all 0: the left
    }
  }

  /// The member of group c with the largest key (the lowest such member on a tie).
  std::uint32_t winner(std::size_t c) const noexcept { return tree_[root_[c]].member; }

  /// Sets member l's key (below 2^63) and replays its path to its group's
  /// root: each node holds the larger key of its children, ties to the left
  /// (the lower member); only the sibling is read at each level. The tie rule
  /// is one integer comparison (left: cur + 1 > sib, right: cur > sib), and
  /// the winner is picked by masks, not a branch.
  void update(std::size_t l, std::uint64_t key) noexcept {
    // Node r of a group's tree is at t + r: root 1, children 2r and 2r + 1.
    node* const t = tree_.data() + (root_[group_of_[l]] - 1);
    std::uint32_t i = leaf_of_[l] - (root_[group_of_[l]] - 1), cl = static_cast<std::uint32_t>(l);
    std::uint64_t cur = key;
    t[i].k = cur;
    while (i != 1) {
      const node sib = t[i ^ 1u];
      // A left child keeps its place on a tie: cur >= sib (cur + 1 > sib,
      // no overflow: keys are below 2^63), a right child only when cur > sib.
      // Which child wins is data-dependent: masks, not a branch.
      const std::uint64_t m = 0u - static_cast<std::uint64_t>(cur + ((i & 1u) ^ 1u) > sib.k);
      cur = (cur & m) | (sib.k & ~m);
      cl = (cl & static_cast<std::uint32_t>(m)) | (sib.member & ~static_cast<std::uint32_t>(m));
      i >>= 1;
      t[i].k = cur;
      t[i].member = cl;
    }
  }

 private:
  struct node {
    std::uint64_t k;
    std::uint32_t member;
  };
  std::vector<node> tree_;                         // every group's tree (see reset)
  std::vector<std::uint32_t> root_;                // per group: index of its root in tree_
  std::vector<std::uint32_t> group_of_, leaf_of_;  // per member; leaf_of_: index in tree_
};

}  // namespace detail
}  // namespace moe_residency
