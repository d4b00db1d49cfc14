// The store test_ssd tests, and the mutants of its mutation check. The durability tests must
// catch a store that skips its syncs or its page checks, and the lock tests one that takes no
// lock: tests/CMakeLists.txt builds test_ssd again as test_ssd_mutant_NO_SYNC (every File under
// the store reports syncs it never makes), test_ssd_mutant_NO_VERIFY (a page check that passes
// every page) and test_ssd_mutant_NO_LOCK (a File whose flock always succeeds), and ctest
// expects them to fail. Neither touches the
// product header: they are BasicSsdTier's own parameters, File and Verify.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kvdrive/tier/ssd.hpp"

namespace kvdrive::test {

/// A File whose syncs do nothing and report success: what they should have made durable is not.
template <class Inner>
struct NoSyncFile : Inner {
  int fdatasync(int) { return 0; }
  int fsync(int) { return 0; }
};

/// A File whose locks always succeed: two writers can open one store.
template <class Inner>
struct NoLockFile : Inner {
  int flock(int, int) { return 0; }
};

/// A page check that passes every page: the store returns whatever it reads.
struct SkipPageChecks {
  static bool intact(const std::byte*, std::size_t, std::uint64_t stored, std::uint64_t& read) {
    read = stored;
    return true;
  }
};

#if defined(KVD_TEST_SSD_MUTANT_NO_SYNC)
template <class File>
using MutantFile = NoSyncFile<File>;
using MutantVerify = tier::VerifyPages;
inline constexpr bool kMutant = true;
#elif defined(KVD_TEST_SSD_MUTANT_NO_LOCK)
template <class File>
using MutantFile = NoLockFile<File>;
using MutantVerify = tier::VerifyPages;
inline constexpr bool kMutant = true;
#elif defined(KVD_TEST_SSD_MUTANT_NO_VERIFY)
template <class File>
using MutantFile = File;
using MutantVerify = SkipPageChecks;
inline constexpr bool kMutant = true;
#else
template <class File>
using MutantFile = File;
using MutantVerify = tier::VerifyPages;
inline constexpr bool kMutant = false;
#endif

/// The store under test over `File`: SsdTier itself (over PosixFile), or this build's mutant.
template <class File = tier::PosixFile>
using StoreUnderTest = tier::BasicSsdTier<MutantFile<File>, MutantVerify>;
static_assert(kMutant || std::is_same_v<StoreUnderTest<>, tier::SsdTier>);

/// A store under test over the File `file` (a FaultFile sharing the test's FaultDisk).
template <class File>
StoreUnderTest<File> store_over(typename StoreUnderTest<File>::Params p, File file) {
  return StoreUnderTest<File>(std::move(p), MutantFile<File>{std::move(file)});
}

}  // namespace kvdrive::test
