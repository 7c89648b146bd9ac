#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gated_delta_net.h"
#include "kernels/cuda/warp_math.cuh"

namespace cleave::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kRowsPerPart = 32;  // rows of S one thread holds
constexpr int kMaxDeltaThreads = 512;
// A block's threads when a column's rows are split P ways: 512 leaves 128 registers a
// thread; with one thread a column (P = 1, every row's k and q kept across the two passes
// over S) 256, leaving it room enough not to spill.
// A head's columns split over blocks (column groups) take at most 256 threads a block too.
__host__ __device__ constexpr int maxDeltaThreads(int parts, bool split = false) {
  return parts == 1 || split ? kMaxDeltaThreads / 2 : kMaxDeltaThreads;
}
constexpr int kConvThreads = 128;

// torch's softplus (beta 1, threshold 20).
__device__ __forceinline__ float softplusOf(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// The shape of one layer's state, as the CPU lays it out (gated_delta_net.h).
struct Shape {
  int dk, dv, ratio, kd, vd, channels, group_channels;
  int64_t group_floats, conv_floats;

  __device__ explicit Shape(const GatedDeltaNetArgs& a)
      : dk(a.key_head_dim),
        dv(a.value_head_dim),
        ratio(a.value_heads / a.key_heads),
        kd(a.key_heads * a.key_head_dim),
        vd(a.value_heads * a.value_head_dim),
        channels(2 * kd + vd),
        group_channels(2 * dk + ratio * dv),
        group_floats(int64_t{a.conv_kernel - 1} * group_channels + int64_t{ratio} * dk * dv),
        conv_floats(int64_t{a.conv_kernel - 1} * group_channels) {}
};

// Sequence `seq`'s layer state.
__device__ __forceinline__ float* layerState(const GatedDeltaNetArgs& a, int seq) {
  return a.states + a.state_slots[seq] * a.slot_floats + a.layer_offset;
}

// Where `at`, a place in sequence `seq`'s layer state, is in the slot that receives the
// state after row `t` as well; null for none. (Addressed from `at`, so that no second base
// stays live through the row loop.)
__device__ __forceinline__ float* afterRow(const GatedDeltaNetArgs& a, int seq, int t, float* at) {
  const int32_t slot = a.row_slots != nullptr ? a.row_slots[t] : -1;
  return slot >= 0 ? at + int64_t{slot - a.state_slots[seq]} * a.slot_floats : nullptr;
}

// Thread = (sequence blockIdx.y, channel): the convolution over the sequence's rows.
template <int kTaps>
__global__ void __launch_bounds__(kConvThreads) convolveKernel(const GatedDeltaNetArgs a) {
  const Shape s(a);
  const int ch = blockIdx.x * kConvThreads + threadIdx.x;
  const int seq = blockIdx.y;
  if (ch >= s.channels) return;
  const int begin = a.q_starts[seq], end = a.q_starts[seq + 1];
  if (begin == end) return;
  // Where the channel keeps its inputs: its key head's group, at its place in a conv row.
  int group, at;
  if (ch < s.kd) {
    group = ch / s.dk, at = ch % s.dk;
  } else if (ch < 2 * s.kd) {
    group = (ch - s.kd) / s.dk, at = s.dk + (ch - s.kd) % s.dk;
  } else {
    const int h = (ch - 2 * s.kd) / s.dv;
    group = h / s.ratio;
    at = 2 * s.dk + (h % s.ratio) * s.dv + (ch - 2 * s.kd) % s.dv;
  }
  float* kept = layerState(a, seq) + group * s.group_floats + at;
  const bool reset = a.positions[begin] == 0;
  float window[kTaps];  // the inputs the next output reads, oldest first
  float weight[kTaps];
#pragma unroll
  for (int j = 0; j < kTaps; ++j) weight[j] = a.conv[ch * kTaps + j];
#pragma unroll
  for (int j = 0; j + 1 < kTaps; ++j) window[j] = reset ? 0.0f : kept[j * s.group_channels];
  for (int t = begin; t < end; ++t) {
    window[kTaps - 1] = __bfloat162float(a.proj[t * a.proj_stride + ch]);
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kTaps; ++j) sum += weight[j] * window[j];
    a.mixed[int64_t{t} * s.channels + ch] = sum * sigmoidOf(sum);
#pragma unroll
    for (int j = 0; j + 1 < kTaps; ++j) window[j] = window[j + 1];
    // The inputs kept after the row: in the sequence's own state after its last row; else
    // in another slot's, where row_slots names one.
    if (float* keep = t + 1 == end ? kept : afterRow(a, seq, t, kept)) {
#pragma unroll
      for (int j = 0; j + 1 < kTaps; ++j) keep[j * s.group_channels] = window[j];
    }
  }
}

// Block = (value head blockIdx.x / column_groups and its column group, sequence
// blockIdx.y); thread (c, p) = (tid / P, tid % P) holds S[32p + i][j] of the group's column
// j = col0 + c: the P threads of a column sit side by side in one warp, so their partial
// sums over the rows meet by shuffles.
// (minBlocks 1: without it ptxas keeps the split variants to 128 registers and spills.)
template <int P, bool kSplit>
__global__ void __launch_bounds__(maxDeltaThreads(P, kSplit), 1)
    deltaRuleKernel(const GatedDeltaNetArgs a) {
  extern __shared__ float shared[];  // q [dk], k [dk], v [width], then the reductions [2 + 32]
  const Shape s(a);
  const int groups = kSplit ? a.column_groups : 1;
  const int h = blockIdx.x / groups, seq = blockIdx.y;
  const int width = s.dv / groups, col0 = (blockIdx.x % groups) * width;
  const int begin = a.q_starts[seq], end = a.q_starts[seq + 1];
  if (begin == end) return;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, warps = blockDim.x / 32;
  const int c = tid / P, part = tid % P, j = col0 + c;
  const bool column = c < width;
  const int key_head = h / s.ratio;
  float* qs = shared;
  float* ks = qs + s.dk;
  float* vs = ks + s.dk;
  float* sums = vs + width;
  float* state = layerState(a, seq) + key_head * s.group_floats + s.conv_floats +
                 int64_t{h % s.ratio} * s.dk * s.dv;
  const bool reset = a.positions[begin] == 0;
  float S[kRowsPerPart];
#pragma unroll
  for (int r = 0; r < kRowsPerPart; ++r) {
    const int i = part * kRowsPerPart + r;
    S[r] = !reset && column && i < s.dk ? state[i * s.dv + j] : 0.0f;
  }
  const float a_rate = a.a_rate[h], dt_bias = a.dt_bias[h];
  const float norm = column && !kSplit ? a.norm[j] : 0.0f;
  const float q_scale = rsqrtf(static_cast<float>(s.dk));
  const int loaded = 2 * s.dk + width;
  for (int t = begin; t < end; ++t) {
    const float* row = a.mixed + int64_t{t} * s.channels;
    for (int i = tid; i < loaded; i += blockDim.x) {
      shared[i] = i < s.dk       ? row[key_head * s.dk + i]
                  : i < 2 * s.dk ? row[s.kd + key_head * s.dk + i - s.dk]
                                 : row[2 * s.kd + h * s.dv + col0 + i - 2 * s.dk];
    }
    __syncthreads();
    if (warp == 0) {  // q's and k's inverse L2 norms (q's times 1/√dk)
      float qq = 0.0f, kk = 0.0f;
      for (int i = lane; i < s.dk; i += 32) qq += qs[i] * qs[i], kk += ks[i] * ks[i];
      qq = warpSum(qq), kk = warpSum(kk);
      if (lane == 0) {
        sums[0] = rsqrtf(qq + 1e-6f) * q_scale;
        sums[1] = rsqrtf(kk + 1e-6f);
      }
    }
    __syncthreads();
    const float q_norm = sums[0], k_norm = sums[1];
    const bf16* proj = a.proj + int64_t{t} * a.proj_stride;
    const int gates = 2 * s.kd + 2 * s.vd;
    const float beta = sigmoidOf(__bfloat162float(proj[gates + h]));
    const float decay =
        expf(a_rate * softplusOf(__bfloat162float(proj[gates + a.value_heads + h]) + dt_bias));
    float kv = 0.0f;
#pragma unroll
    for (int r = 0; r < kRowsPerPart; ++r) {
      const int i = part * kRowsPerPart + r;
      if (i < s.dk) {
        S[r] *= decay;
        kv += S[r] * (ks[i] * k_norm);
      }
    }
#pragma unroll
    for (int offset = P / 2; offset > 0; offset /= 2)
      kv += __shfl_xor_sync(0xffffffffu, kv, offset);
    const float delta = column ? beta * (vs[c] - kv) : 0.0f;
    float o = 0.0f;
#pragma unroll
    for (int r = 0; r < kRowsPerPart; ++r) {
      const int i = part * kRowsPerPart + r;
      if (i < s.dk) {
        S[r] += (ks[i] * k_norm) * delta;
        o += S[r] * (qs[i] * q_norm);
      }
    }
#pragma unroll
    for (int offset = P / 2; offset > 0; offset /= 2) o += __shfl_xor_sync(0xffffffffu, o, offset);
    // The state after the row: the sequence's own after its last row; else another slot's,
    // where row_slots names one. (One store for both keeps the registers under the cap.)
    if (float* keep = t + 1 == end ? state : afterRow(a, seq, t, state)) {
#pragma unroll
      for (int r = 0; r < kRowsPerPart; ++r) {
        const int i = part * kRowsPerPart + r;
        if (column && i < s.dk) keep[i * s.dv + j] = S[r];
      }
    }
    if constexpr (kSplit) {  // The head's other columns are other blocks': gatedNormKernel.
      if (column && part == 0) a.raw[int64_t{t} * s.vd + h * s.dv + j] = o;
      __syncthreads();  // before the next row overwrites q, k, v and the sums
      continue;
    }
    // The gated RMSNorm over the head's d_v outputs.
    const float squares = warpSum(column && part == 0 ? o * o : 0.0f);
    if (lane == 0) sums[2 + warp] = squares;
    __syncthreads();
    float total = 0.0f;
    for (int w = 0; w < warps; ++w) total += sums[2 + w];
    if (column && part == 0) {
      const float z = __bfloat162float(proj[2 * s.kd + s.vd + h * s.dv + j]);
      const float normed = o * rsqrtf(total / static_cast<float>(s.dv) + a.eps) * norm;
      a.out[int64_t{t} * a.out_stride + h * s.dv + j] = __float2bfloat16(normed * z * sigmoidOf(z));
    }
    __syncthreads();  // before the next row overwrites q, k, v and the sums
  }
}

// Warp = (token, value head) of `raw`: the head's outputs RMS-normed with `norm`, times
// SiLU(z), written bf16 (what the delta rule does itself without column groups).
__global__ void __launch_bounds__(128) gatedNormKernel(const GatedDeltaNetArgs a) {
  const Shape s(a);
  const int64_t item = int64_t{blockIdx.x} * 4 + threadIdx.x / 32;
  if (item >= int64_t{a.tokens} * a.value_heads) return;
  const int64_t t = item / a.value_heads;
  const int h = static_cast<int>(item % a.value_heads), lane = threadIdx.x % 32;
  const float* o = a.raw + t * s.vd + h * s.dv;
  float squares = 0.0f;
  for (int j = lane; j < s.dv; j += 32) squares += o[j] * o[j];
  const float inverse = rsqrtf(warpSum(squares) / static_cast<float>(s.dv) + a.eps);
  const bf16* z = a.proj + t * a.proj_stride + 2 * s.kd + s.vd + h * s.dv;
  for (int j = lane; j < s.dv; j += 32) {
    const float zj = __bfloat162float(z[j]);
    a.out[t * a.out_stride + h * s.dv + j] =
        __float2bfloat16(o[j] * inverse * a.norm[j] * zj * sigmoidOf(zj));
  }
}

// Rows of S a column's threads split: 32 each, their count a power of two.
int partsOf(int key_head_dim) { return key_head_dim <= 32 ? 1 : key_head_dim <= 64 ? 2 : 4; }

int deltaThreads(int key_head_dim, int value_head_dim) {
  const int threads = value_head_dim * partsOf(key_head_dim);
  return (threads + 31) / 32 * 32;
}

template <int kTaps>
absl::Status launchConvolve(const GatedDeltaNetArgs& a, int channels, cudaStream_t stream) {
  const dim3 grid((channels + kConvThreads - 1) / kConvThreads, a.sequences);
  convolveKernel<kTaps><<<grid, kConvThreads, 0, stream>>>(a);
  return launchStatus("gated_delta_net convolution");
}

absl::Status launchConvolve(const GatedDeltaNetArgs& a, int channels, cudaStream_t stream) {
  switch (a.conv_kernel) {
    case 2: return launchConvolve<2>(a, channels, stream);
    case 3: return launchConvolve<3>(a, channels, stream);
    case 4: return launchConvolve<4>(a, channels, stream);
    case 5: return launchConvolve<5>(a, channels, stream);
    default: return launchConvolve<6>(a, channels, stream);
  }
}

template <int P>
absl::Status launchDeltaRule(const GatedDeltaNetArgs& a, cudaStream_t stream) {
  const int width = a.value_head_dim / a.column_groups;
  const int threads = deltaThreads(a.key_head_dim, width);
  const size_t shared = sizeof(float) * (2 * a.key_head_dim + width + 2 + kMaxDeltaThreads / 32);
  const dim3 grid(a.value_heads * a.column_groups, a.sequences);
  if (a.column_groups == 1) {
    deltaRuleKernel<P, false><<<grid, threads, shared, stream>>>(a);
    return launchStatus("gated_delta_net delta rule");
  }
  deltaRuleKernel<P, true><<<grid, threads, shared, stream>>>(a);
  if (absl::Status s = launchStatus("gated_delta_net delta rule"); !s.ok()) return s;
  if (a.tokens == 0) return absl::OkStatus();
  const int64_t warps = int64_t{a.tokens} * a.value_heads;
  gatedNormKernel<<<static_cast<unsigned>((warps + 3) / 4), 128, 0, stream>>>(a);
  return launchStatus("gated_delta_net gated norm");
}

}  // namespace

absl::Status gatedDeltaNetSupported(int key_head_dim, int value_head_dim, int conv_kernel,
                                    int key_heads, int value_heads) {
  if (conv_kernel < 2 || conv_kernel > 6)
    return absl::InvalidArgumentError(absl::StrCat(
        "linear attention: a convolution of ", conv_kernel, " taps (the GPU kernels take 2 to 6)"));
  if (key_head_dim < 1 || key_head_dim > 4 * kRowsPerPart || value_head_dim < 1 ||
      deltaThreads(key_head_dim, value_head_dim) > maxDeltaThreads(partsOf(key_head_dim)))
    return absl::InvalidArgumentError(absl::StrCat(
        "linear attention: key heads of ", key_head_dim, " and value heads of ", value_head_dim,
        " (the GPU kernels take key heads up to 128, value heads "
        "up to 256, and value heads × ceil(key head / 32) up to 512)"));
  if (key_heads < 1 || value_heads % key_heads != 0)
    return absl::InvalidArgumentError(absl::StrCat("linear attention: ", value_heads,
                                                   " value heads over ", key_heads, " key heads"));
  return absl::OkStatus();
}

int64_t gatedDeltaNetGroupFloats(int key_head_dim, int value_head_dim, int conv_kernel, int ratio) {
  const int64_t channels = 2 * int64_t{key_head_dim} + int64_t{ratio} * value_head_dim;
  return (conv_kernel - 1) * channels + int64_t{ratio} * key_head_dim * value_head_dim;
}

int gatedDeltaNetColumnGroups(int key_head_dim, int value_head_dim) {
  for (int groups : {4, 2}) {
    if (value_head_dim % groups == 0 && deltaThreads(key_head_dim, value_head_dim / groups) <=
                                            maxDeltaThreads(partsOf(key_head_dim), true))
      return groups;
  }
  return 1;
}

absl::Status gatedDeltaNet(const GatedDeltaNetArgs& a, cudaStream_t stream) {
  if (a.sequences == 0) return absl::OkStatus();
  if (absl::Status ok = gatedDeltaNetSupported(a.key_head_dim, a.value_head_dim, a.conv_kernel,
                                               a.key_heads, a.value_heads);
      !ok.ok())
    return ok;
  if (a.column_groups < 1 || a.value_head_dim % a.column_groups != 0 ||
      (a.column_groups > 1 && (a.raw == nullptr || a.tokens < 0 ||
                               deltaThreads(a.key_head_dim, a.value_head_dim / a.column_groups) >
                                   maxDeltaThreads(partsOf(a.key_head_dim), true))))
    return absl::InvalidArgumentError(absl::StrCat(
        "gated_delta_net: ", a.column_groups, " column groups of value heads of ", a.value_head_dim,
        " (a divisor leaving at most 256 threads a block, with a raw-output "
        "scratch and the rows)"));
  const int channels = 2 * a.key_heads * a.key_head_dim + a.value_heads * a.value_head_dim;
  if (absl::Status launched = launchConvolve(a, channels, stream); !launched.ok()) return launched;
  switch (partsOf(a.key_head_dim)) {
    case 1: return launchDeltaRule<1>(a, stream);
    case 2: return launchDeltaRule<2>(a, stream);
    default: return launchDeltaRule<4>(a, stream);
  }
}

}  // namespace cleave::cuda
