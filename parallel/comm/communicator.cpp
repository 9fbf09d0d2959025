// What every backend shares: subgroup()'s default (not supported) and its argument checks.
#include "parallel/comm/communicator.h"

#include <algorithm>
#include <sstream>

namespace strata::parallel {

std::unique_ptr<Communicator> Communicator::subgroup(const std::vector<int>& members, int tag) {
  STRATA_THROW() << "the " << backend() << " communicator cannot make a communicator of a subset "
                 << "of its ranks (subgroup of " << members.size() << " ranks, tag " << tag << ")";
}

void check_subgroup(const std::vector<int>& members, int tag, int rank, int size,
                    const std::string& backend) {
  std::ostringstream list;
  for (size_t i = 0; i < members.size(); ++i) list << (i ? "," : "") << members[i];
  const std::string what = backend + " comm subgroup({" + list.str() + "}, tag " +
                           std::to_string(tag) + ") on rank " + std::to_string(rank);
  STRATA_CHECK(!members.empty()) << what << ": no members";
  STRATA_CHECK(tag >= 0 && tag < 32768) << what << ": tag must be in [0, 32768)";
  std::vector<int> sorted = members;
  std::sort(sorted.begin(), sorted.end());
  STRATA_CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end())
      << what << ": a rank is listed twice";
  STRATA_CHECK(sorted.front() >= 0 && sorted.back() < size)
      << what << ": ranks must be in [0, " << size << ")";
  STRATA_CHECK(std::binary_search(sorted.begin(), sorted.end(), rank))
      << what << ": the calling rank is not a member";
}

}  // namespace strata::parallel
