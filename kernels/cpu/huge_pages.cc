#include "kernels/cpu/huge_pages.h"

#include <sys/mman.h>

#include <cstdio>
#include <cstring>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/log.h"

namespace cleave::cpu {
namespace {

constexpr int64_t kHugePage = int64_t{2} << 20;
constexpr int64_t kSlab = int64_t{32} << 20;  // What small buffers are carved from.

int64_t roundUp(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

// A zeroed mapping of `bytes` (a multiple of 4 KiB) starting on a 2 MiB boundary, advised as
// huge pages; it unmaps itself when the last reference goes.
std::shared_ptr<uint8_t> mapAligned(int64_t bytes) {
  const size_t reserve = static_cast<size_t>(bytes + kHugePage);
  void* raw = ::mmap(nullptr, reserve, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  // Keep the 2 MiB-aligned part; give back the rest on either side.
  auto* base = static_cast<uint8_t*>(raw);
  const auto address = reinterpret_cast<uintptr_t>(raw);
  const size_t head = (kHugePage - address % kHugePage) % kHugePage;
  if (head > 0) ::munmap(base, head);
  const size_t tail = reserve - head - static_cast<size_t>(bytes);
  if (tail > 0) ::munmap(base + head + bytes, tail);
  uint8_t* aligned = base + head;
  // Only advice: where the kernel declines, these are ordinary pages.
  (void)::madvise(aligned, static_cast<size_t>(bytes), MADV_HUGEPAGE);
  return std::shared_ptr<uint8_t>(aligned,
                                  [bytes](uint8_t* p) { ::munmap(p, static_cast<size_t>(bytes)); });
}

// Says once, when the first buffer is made, that huge pages are off.
void noteMode() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (std::strcmp(hugePageMode(), "never") == 0)
      CLEAVE_LOG(WARNING) << "transparent huge pages are off "
                             "(/sys/kernel/mm/transparent_hugepage/enabled is never): the KV "
                             "cache and repacked weights stream from 4 KiB pages, slower";
  });
}

// The slab small buffers come from: a bump pointer through the current 32 MiB mapping. Every
// buffer holds its slab; the allocator holds only the current one.
class Slabs {
 public:
  std::shared_ptr<uint8_t> carve(int64_t bytes, int64_t alignment) {
    absl::MutexLock lock(&mu_);
    int64_t at = roundUp(used_, alignment);
    if (current_ == nullptr || at + bytes > kSlab) {
      current_ = mapAligned(kSlab);
      if (current_ == nullptr) return nullptr;
      at = 0;
    }
    used_ = at + bytes;
    return std::shared_ptr<uint8_t>(current_, current_.get() + at);  // Shares the slab's count.
  }

 private:
  absl::Mutex mu_;
  std::shared_ptr<uint8_t> current_ ABSL_GUARDED_BY(mu_);
  int64_t used_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

std::shared_ptr<uint8_t> allocateOnHugePages(int64_t bytes, int64_t alignment) {
  if (bytes <= 0 || alignment <= 0 || alignment > 4096 || (alignment & (alignment - 1)) != 0)
    return nullptr;
  noteMode();
  if (bytes >= kHugePage) return mapAligned(roundUp(bytes, 4096));
  static Slabs* slabs = new Slabs();  // Never destroyed: buffers may outlive static teardown.
  return slabs->carve(bytes, alignment);
}

const char* hugePageMode() {
  static const char* mode = [] {
    FILE* f = std::fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (f == nullptr) return "";
    char line[128] = {};
    const bool read = std::fgets(line, sizeof(line), f) != nullptr;
    std::fclose(f);
    if (!read) return "";
    // The kernel brackets the mode in force: "always [madvise] never".
    for (const char* m : {"always", "madvise", "never"}) {
      char bracketed[16];
      std::snprintf(bracketed, sizeof(bracketed), "[%s]", m);
      if (std::strstr(line, bracketed) != nullptr) return m;
    }
    return "";
  }();
  return mode;
}

}  // namespace cleave::cpu
