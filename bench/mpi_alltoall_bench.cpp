// MPI_Alltoall on this host: the reference bench_comm's BM_AllToAll is compared with (see
// run_comm_vs_mpi.sh). A plain MPI program, one process per rank:
//
//   mpirun --oversubscribe -np 8 build/bench/bench_mpi_alltoall [--reps N]
//
// For every per-peer size of bench_comm (64 KiB .. 64 MiB, skipping those whose buffers over all
// ranks, 2 * P * P * bytes, exceed 3 GiB, as bench_comm does), rank 0 prints one line:
//
//   ranks bytes_per_peer median_s alg_GBps reps
//
// median_s is the median over `reps` timed repetitions (after one warm-up) of the slowest rank's
// time for one MPI_Alltoall, each repetition starting after a barrier; alg_GBps is the algorithm
// bandwidth per rank, (P - 1) * bytes_per_peer / median_s, as bench_comm reports. Lines starting
// with '#' are comments.
#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr std::size_t KiB = 1024, MiB = 1024 * KiB, GiB = 1024 * MiB;
constexpr std::size_t kMaxBytes = 3 * GiB;  // all ranks' send + receive buffers

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + static_cast<long>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, P = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  int min_reps = 5;
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--reps" && i + 1 < argc)
      min_reps = std::max(1, std::atoi(argv[++i]));

  if (rank == 0) {
    char lib[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(lib, &len);
    std::string first(lib, static_cast<size_t>(len));
    first = first.substr(0, first.find_first_of("\n,"));
    std::printf("# MPI_Alltoall, %d ranks, %s\n", P, first.c_str());
    std::printf("# ranks bytes_per_peer median_s alg_GBps reps\n");
    std::fflush(stdout);
  }
  const std::size_t sizes[] = {64 * KiB, 256 * KiB, 1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB};
  for (std::size_t per : sizes) {
    const std::size_t total = 2 * std::size_t(P) * std::size_t(P) * per;
    if (total > kMaxBytes) {
      if (rank == 0)
        std::printf("# %zu bytes per peer skipped: %zu MiB of buffers\n", per, total / MiB);
      continue;
    }
    // About 1 GiB of output over all ranks per size, as bench_comm; at least min_reps.
    const int reps = static_cast<int>(std::clamp<std::size_t>(
        GiB / (std::size_t(P) * std::size_t(P) * per), std::size_t(min_reps), 300));
    // MPI_Alltoall counts are ints: send per-peer blocks as 64-byte elements.
    MPI_Datatype block;
    MPI_Type_contiguous(64, MPI_BYTE, &block);
    MPI_Type_commit(&block);
    const int count = static_cast<int>(per / 64);
    std::vector<unsigned char> send(per * std::size_t(P)), recv(per * std::size_t(P));
    for (int d = 0; d < P; ++d)
      std::memset(send.data() + std::size_t(d) * per, (rank * 16 + d + 1) & 0xff, per);
    std::memset(recv.data(), 0, recv.size());
    MPI_Alltoall(send.data(), count, block, recv.data(), count, block, MPI_COMM_WORLD);  // warm-up
    for (int s = 0; s < P; ++s)
      if (recv[std::size_t(s) * per] != ((s * 16 + rank + 1) & 0xff)) {
        std::fprintf(stderr, "rank %d: wrong bytes from %d\n", rank, s);
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
    std::vector<double> times;
    for (int i = 0; i < reps; ++i) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      MPI_Alltoall(send.data(), count, block, recv.data(), count, block, MPI_COMM_WORLD);
      double dt = MPI_Wtime() - t0, slowest = 0;
      MPI_Allreduce(&dt, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      times.push_back(slowest);
    }
    MPI_Type_free(&block);
    if (rank == 0) {
      const double m = median(times);
      std::printf("%d %zu %.9f %.4f %d\n", P, per, m, double(P - 1) * double(per) / m / 1e9, reps);
      std::fflush(stdout);
    }
  }
  MPI_Finalize();
  return 0;
}
