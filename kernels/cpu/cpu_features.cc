#include "kernels/cpu/cpu_features.h"

#include <cpuid.h>

#include <cstdlib>
#include <cstring>

namespace cleave::cpu {
namespace {

bool osSavesAvx512State() {
  unsigned eax, edx;
  // XGETBV(0): bits 1,2 (SSE, AVX) and 5,6,7 (opmask, ZMM upper halves, ZMM16-31).
  __asm__("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (eax & 0xe6) == 0xe6;
}

bool osSavesAvxState() {
  unsigned eax, edx;
  __asm__("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (eax & 0x6) == 0x6;
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return f;
  bool osxsave = ecx & bit_OSXSAVE;
  bool avx_state = osxsave && osSavesAvxState();
  f.fma = avx_state && (ecx & bit_FMA);
  f.f16c = avx_state && (ecx & bit_F16C);
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return f;
  f.avx2 = avx_state && (ebx & bit_AVX2);
  bool zmm_state = osxsave && osSavesAvx512State();
  f.avx512f = zmm_state && (ebx & bit_AVX512F);
  f.avx512bw = zmm_state && (ebx & bit_AVX512BW);
  f.avx512vl = zmm_state && (ebx & bit_AVX512VL);
  f.avx512vnni = zmm_state && (ecx & bit_AVX512VNNI);
  if (__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx)) {
    f.avx512bf16 = zmm_state && (eax & bit_AVX512BF16);
  }
  return f;
}

Isa hardwareIsa() {
  const CpuFeatures& f = cpuFeatures();
  if (f.avx512f && f.avx512bw && f.avx512vl && f.avx512vnni && f.fma && f.f16c) return Isa::kAvx512;
  if (f.avx2 && f.fma && f.f16c) return Isa::kAvx2;
  return Isa::kPortable;
}

}  // namespace

const CpuFeatures& cpuFeatures() {
  static const CpuFeatures features = detect();
  return features;
}

bool isaSupported(Isa isa) { return static_cast<int>(isa) <= static_cast<int>(hardwareIsa()); }

Isa bestIsa() {
  static const Isa chosen = [] {
    Isa isa = hardwareIsa();
    if (const char* cap = std::getenv("CLEAVE_CPU_ISA")) {
      Isa wanted = std::strcmp(cap, "portable") == 0 ? Isa::kPortable
                   : std::strcmp(cap, "avx2") == 0   ? Isa::kAvx2
                                                     : Isa::kAvx512;
      if (static_cast<int>(wanted) < static_cast<int>(isa)) isa = wanted;
    }
    return isa;
  }();
  return chosen;
}

const char* isaName(Isa isa) {
  switch (isa) {
    case Isa::kPortable: return "portable";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512-vnni";
  }
  return "unknown";
}

}  // namespace cleave::cpu
