# Sourced by scripts/run and scripts/test: installs the Debian packages NodeEmu builds with,
# and only those that are missing, so a second run costs nothing.
# libboost-context-dev also brings libboost1.74-dev, the header-only libraries (boost::container).
nodeemu_packages=(cmake g++ make pkg-config libhwloc-dev libnuma-dev libopenblas-dev
                  libyaml-cpp-dev nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev googletest
                  libbenchmark-dev libboost-context-dev libgoogle-perftools-dev)

nodeemu_install_missing() {
  local missing=()
  for p in "${nodeemu_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "nodeemu: installing missing packages: ${missing[*]}" >&2
  local sudo=()
  [ "$(id -u)" -ne 0 ] && sudo=(sudo)
  # The package manager's log is shown only when it fails: a working install is one line.
  local log
  log=$(mktemp)
  if "${sudo[@]}" apt-get update -qq >"$log" 2>&1 &&
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends \
      "${missing[@]}" >>"$log" 2>&1; then
    rm -f "$log"
    echo "nodeemu: installed ${missing[*]}" >&2
  else
    cat "$log" >&2
    rm -f "$log"
    echo "nodeemu: installing ${missing[*]} failed (the package manager's log is above)" >&2
    return 1
  fi
}

# The ThreadSanitizer preset builds with clang 14 (CMakePresets.json): its TSan runtime is
# LLVM's third version, which ran the test suite ~1.7x faster than GCC 12's (bench/README.md,
# "The test suite under ThreadSanitizer"). The runtime library is only recommended by clang-14,
# so it is named.
nodeemu_tsan_packages=(clang-14 libclang-rt-14-dev)

# The build folder of a preset (CMakePresets.json's binaryDir).
nodeemu_build_dir() {
  case "$1" in
    default) echo build ;;
    asan-ubsan) echo build-asan ;;
    *) echo "build-$1" ;;
  esac
}

# Configures (once) and builds one CMake preset incrementally with the machine's cores:
# nodeemu_build PRESET [TARGET...] builds everything, or only the targets.
nodeemu_build() {
  local preset=$1
  shift
  if [ "$preset" = tsan ]; then
    local nodeemu_packages=("${nodeemu_tsan_packages[@]}")  # bash scoping: seen by the call below
    nodeemu_install_missing || return 1
    # A build folder configured before the preset named clang keeps its compiler: start it again.
    if [ -f build-tsan/CMakeCache.txt ] &&
      ! grep -q '^CMAKE_CXX_COMPILER:[A-Z]*=.*clang++-14$' build-tsan/CMakeCache.txt; then
      echo "nodeemu: build-tsan was configured with another compiler; configuring it again with clang 14" >&2
      rm -rf build-tsan
    fi
  fi
  local dir
  dir=$(nodeemu_build_dir "$preset")
  if [ ! -f "$dir/CMakeCache.txt" ]; then
    cmake --preset "$preset" >&2
  fi
  if [ $# -eq 0 ]; then
    cmake --build --preset "$preset" -j "$(nproc)" >&2
  else
    cmake --build --preset "$preset" -j "$(nproc)" --target "$@" >&2
  fi
}

# Optional, benchmarks only: MPI for bench_mpi_alltoall, the reference of bench_comm. Installed by
# bench/run_comm_vs_mpi.sh, never by scripts/run or scripts/test; bench/CMakeLists.txt builds that
# benchmark only when CMake finds MPI (re-run cmake after installing).
nodeemu_bench_packages=(openmpi-bin libopenmpi-dev)

nodeemu_install_bench_extras() {
  local nodeemu_packages=("${nodeemu_bench_packages[@]}")  # bash scoping: seen by the call below
  nodeemu_install_missing
}

# For the calibration pipeline test (tools/measure_gpu.py run on the CPU): Debian's CPU build of
# PyTorch. Installed by scripts/test; a failed install is not fatal, that one test then skips and
# says why.
nodeemu_test_packages=(python3-torch)

nodeemu_install_test_extras() {
  local nodeemu_packages=("${nodeemu_test_packages[@]}")  # bash scoping: seen by the call below
  nodeemu_install_missing ||
    echo "nodeemu: could not install python3-torch; the calibration pipeline test will skip" >&2
}
