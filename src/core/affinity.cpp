#include "core/affinity.h"

#include <pthread.h>
#include <sched.h>

#include <sstream>

#include "core/error.h"

namespace duet {

namespace {

cpu_set_t to_set(const std::vector<int>& cores) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cores) CPU_SET(c, &set);
  return set;
}

std::vector<int> from_set(const cpu_set_t& set) {
  std::vector<int> cores;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cores.push_back(c);
  return cores;
}

std::string list(const std::vector<int>& cores) {
  std::ostringstream s;
  for (size_t i = 0; i < cores.size(); ++i) s << (i ? "," : "") << cores[i];
  return s.str();
}

}  // namespace

std::vector<int> allowed_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return {0};
  return from_set(set);
}

void pin_thread(std::thread& t, const std::vector<int>& cores) {
  const cpu_set_t set = to_set(cores);
  const int rc = pthread_setaffinity_np(t.native_handle(), sizeof(set), &set);
  if (rc != 0)
    DUET_ERROR("cannot pin a thread to cores " << list(cores) << " (error " << rc << ")");
}

void pin_this_thread(const std::vector<int>& cores) {
  const cpu_set_t set = to_set(cores);
  const int rc = pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
  if (rc != 0)
    DUET_ERROR("cannot pin a thread to cores " << list(cores) << " (error " << rc << ")");
}

std::vector<int> this_thread_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  pthread_getaffinity_np(pthread_self(), sizeof(set), &set);
  return from_set(set);
}

CoreSplit split_cores(const std::vector<int>& allowed, int rank, int n_ranks, int comm) {
  const size_t n = allowed.size(), k = static_cast<size_t>(std::max(1, n_ranks));
  const size_t r = static_cast<size_t>(rank);
  std::vector<int> share(allowed.begin() + static_cast<std::ptrdiff_t>(r * n / k),
                         allowed.begin() + static_cast<std::ptrdiff_t>((r + 1) * n / k));
  if (comm < 0 || static_cast<size_t>(comm) >= share.size()) {
    DUET_ERROR("--comm-cores " << comm << ": rank " << rank << " has " << share.size()
                               << " core(s) (" << list(share)
                               << "), and needs at least one left for compute");
  }
  CoreSplit s;
  s.compute.assign(share.begin(), share.end() - comm);
  s.comm.assign(share.end() - comm, share.end());
  return s;
}

void name_this_thread(const char* name) {
  char buf[16] = {};
  for (size_t i = 0; i + 1 < sizeof(buf) && name[i]; ++i) buf[i] = name[i];
  pthread_setname_np(pthread_self(), buf);
}

}  // namespace duet
