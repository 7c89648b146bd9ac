// What the CPU this process runs on can do, detected once at run time. Kernels pick their
// SIMD path from it; CLEAVE_CPU_ISA=portable|avx2|avx512 caps the choice (for tests and for
// comparing paths on one machine).
#pragma once

namespace cleave::cpu {

enum class Isa {
  kPortable = 0,  // Plain C++.
  kAvx2 = 1,      // AVX2 + FMA + F16C.
  kAvx512 = 2,    // AVX-512 F/BW/VL + VNNI.
};

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512vnni = false;
  bool avx512bf16 = false;
};

const CpuFeatures& cpuFeatures();

// The best path the CPU supports, capped by CLEAVE_CPU_ISA.
Isa bestIsa();
const char* isaName(Isa isa);
// True when `isa` can run here.
bool isaSupported(Isa isa);

}  // namespace cleave::cpu
