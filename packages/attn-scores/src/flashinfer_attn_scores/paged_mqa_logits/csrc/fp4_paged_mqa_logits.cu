// MXFP4 paged MQA logits for Hopper (SM90a).
//
//   out[b*NEXT_N + t, p] = sum_h w[b*NEXT_N + t, h] * relu(q[b, t, h, :] . k[p, :])
//
// with q and k E2M1 values times one UE8M0 scale per 32-element group. Hopper has no FP4
// tensor cores, so the kernel decodes E2M1 into E4M3 and runs the same FP8 WGMMA as the FP8
// kernel (tokens as M, every draft slot's heads as N, one pass over the KV for next_n 1..4).
// The pipeline, schedule walk, block-table window and epilogue sums are the FP8 kernel's
// (paged_mqa_common.cuh); what differs:
//
//   * KV tiles are the raw packed bytes (64 B per token, no swizzle): consumers read them
//     with LDS.128, decode in registers and feed WGMMA's A operand from registers (RS form),
//     so the decoded tile never goes back to shared memory.
//   * The producer decodes q once per request into the WGMMA B layout in shared memory.
//
// Group scales (the re-expression, and its error bound)
// ------------------------------------------------------
// E4M3 holds every E2M1 value times 2^s exactly for s in [-8, 6] (6 * 2^6 = 384 <= 448;
// 0.5 * 2^-8 = 2^-9 is E4M3's smallest subnormal and 1.5 * 2^-8 = 3 * 2^-9 is on its grid).
// For a k token with group exponents e_g (UE8M0 bytes) let M = max_g e_g and d_g = M - e_g.
// The kernel stores group g's values as v * 2^(6 - d_g), i.e. the true values times
// 2^(133 - M), a positive per-token factor that commutes with the ReLU and is undone after
// the head sum. q is treated the same way per (draft slot, head) row with Mq = max_g eq_g;
// its factor 2^(133 - Mq) differs between heads, so the kernel divides it out of each head's
// weight: w'_h = w_h * 2^(Mq_h - R_t) with a per-draft-slot anchor R_t, and multiplies the
// slot's sum by 2^(M + R_t - 266) at the end. The float32 and tensor-core (bfloat16) epilogues
// choose R_t from the weights and the q exponents (fold_anchor: no scaled sum overflows where
// the logit does not, and a head stays normal while its |w_h| 2^Mq_h is within about 2^220 of
// the slot's largest). The float16 epilogue keeps R_t = Q_t = max_h Mq_h, multiplies each
// score by 2^(Mq_h - Q_t) and 2^(M + Q_t - 266) before rounding it, and is exact while
// M + Q_t lies in [156, 367] (each score's intermediate product is then a normal float for
// every score float16 can hold; beyond it a score can flush or saturate early).
//
// Range limits of the float32 and tensor-core epilogues: a result overflows to inf only from
// 2^128, as in float32 (from 2^126 where fold_anchor's upper bound binds, weights beyond
// 2^105); results below float32's normal range (2^-126) are rounded as float32 subnormals.
//
// Exactness: every decoded value is exact while d_g <= 14 (a token's or a q row's group
// scales within a factor 2^14 of each other), and then the only roundings are the FP8 WGMMA
// accumulation and the epilogue, as in the FP8 kernel. A group with d_g > 14 is rounded to the
// E4M3 grid (round-to-nearest-even, flushed to zero below 2^-10): each of its values moves by
// at most 2^-10 in units where the token's largest-scale group spans [-384, 384], i.e. by at
// most 2^(M - 127) * 2^-16 in true units. The error of one head's dot product is therefore
// bounded by
//   |delta(q_h . k)| <= 2^-16 * (2^(M - 127) * sum_{i in rounded k groups} |q_hi|
//                                + 2^(Mq_h - 127) * sum_{i in rounded q groups} |k_i|)   (+ the product of both terms)
// (each term at most 2^-16 of what the largest-scale group could contribute). Data written by an
// MXFP4 quantiser has groups within a few binades of each other and stays in the exact range;
// the tests exercise both regimes (tests/paged_mqa_logits/test_gpu_fp4_scales.py).
//
// Specialisation constants: BLOCK_SIZE, NEXT_N, NUM_STAGES, NUM_CONSUMERS, NUM_PRODUCERS,
// MMA_HALVES, OUT_DTYPE, EPI_DTYPE (0 fp32, 1 fp16, 2 bf16), SF_INTERLEAVED, WEIGHT_PAIR_LOADS,
// SCHEDULE_ENTRY_UNITS, SHARED_BYTES (the launch's dynamic shared memory). NUM_HEADS = 64,
// HEAD_DIM = 128.

#include <cuda_fp8.h>

// Measurement variants (never set in production; the output is then wrong): EXP_SKIP_MATH=1
// releases each stage and writes one value per row; EXP_SKIP_DECODE=1 feeds the packed bytes
// to the MMA undecoded; EXP_SKIP_MMA=1 decodes but issues no MMA; EXP_SKIP_EPILOGUE=1 replaces
// the epilogue by one store per row.
#ifndef EXP_SKIP_DECODE
#define EXP_SKIP_DECODE 0
#endif
// EXP_PHASES=1: as in the FP8 kernel (ConsumerPhases, run_producer); here a consumer's
// "issuing" phase also reads the stage and decodes it.

#define NUM_HEADS 64
#define HEAD_DIM 128
#ifndef PRIME_TABLE_WINDOW  // a define of the launch (a measurement) wins
#define PRIME_TABLE_WINDOW 0   // see BlockTableWindow
#endif
// TC_HEAD_SUM (the bfloat16 epilogue; 0 is a measurement knob): the weighted head sums run on
// the tensor cores as a second WGMMA, relu(S) (64 tokens x N, bfloat16, from registers) times
// a per-request N x 8 bfloat16 tile whose column 2t holds draft slot t's folded weights in rows
// 64t .. 64t + 63 (the slot's heads) and 0 elsewhere, so column 2t of the 64 x 8 float32
// result is slot t's sum. EXP_PHASES then counts the head sum's MMA in "MMA wait". The
// accumulator stays in the scaled units (the bfloat16 exponent range is float32's, and the
// scaled scores are at most 128 * 384^2), so relu(S) costs one F2FP per pair instead of two
// power-of-two multiplies per score, an F2FP and an HFMA2 per pair. Rounding: each relu(score)
// and each folded weight once to bfloat16, as in the CUDA-core bfloat16 epilogue, but the
// products and sums are float32.
#ifndef TC_HEAD_SUM
#define TC_HEAD_SUM (EPI_DTYPE == 2)
#endif
#include "paged_mqa_common.cuh"
#include "wgmma_fp8.cuh"

namespace {

using namespace fi_paged_mqa;

constexpr int kRowBytes = HEAD_DIM / 2;  // packed E2M1 bytes per token / per q row
constexpr int kGroups = HEAD_DIM / 32;   // UE8M0 scales per token (one 32-bit word)
constexpr int kKvTileBytes = kTile * kRowBytes;
constexpr int kQRowBytes = HEAD_DIM;  // decoded E4M3, one 128-byte swizzle row per q row
constexpr int kQSlotBytes = kN * kQRowBytes;
// Interleaved scale slots permute a whole 128-token block, so each unit takes all of them.
constexpr int kScaleBytes = SF_INTERLEAVED ? BLOCK_SIZE * 4 : kTile * 4;
constexpr int kLutLevels = 32;  // d = M - e in [0, 31]; larger d decodes to zeros like d = 31
// Registers per thread (the split: RegisterSplit in paged_mqa_common.cuh). The producers
// keep 64 (q staging holds a whole 64-byte q row per lane; with 56, 15 of the 144
// configurations spill with NVRTC 13.5, 4 bytes stored and 32 loaded, all at next_n 2 and 3),
// except at next_n 3 with the float32 epilogue and blocks of 64 or 128 tokens: there the
// consumers spill 4 bytes under NVRTC 13.0 with 144 registers and none with 152, and the
// producers fit in 56. PRODUCER_REGS (measurement) overrides it.
#ifndef PRODUCER_REGS
#define PRODUCER_REGS (NEXT_N == 3 && EPI_DTYPE == 0 && BLOCK_SIZE >= 64 ? 56 : 64)
#endif
constexpr int kProducerRegs = PRODUCER_REGS;
using Registers = RegisterSplit<kProducerRegs>;

static_assert(NEXT_N >= 1 && NEXT_N <= 4, "next_n must be 1..4");
static_assert(!SF_INTERLEAVED || BLOCK_SIZE == 128, "interleaved scale factors need block size 128");
static_assert(!SF_INTERLEAVED || BLOCK_SIZE == 2 * kTile, "token_scales' slot formula: two 64-token units per block");
static_assert(BLOCK_SIZE == 32 || BLOCK_SIZE == 64 || BLOCK_SIZE == 128, "block size must be 32, 64 or 128");

using Mma = WgmmaFp8<kNHalf, true>;

// WEIGHT_PAIR_LOADS = 1 (float32 epilogue only; the launcher chooses it,
// fp4_sm90.weight_pair_loads): the folded weights are stored quad-major. A consumer lane of
// quad q needs the weights of columns 8j + 2q and 8j + 2q + 1 for every 8-column group j, so
// they are stored as one run per quad (column 8j + 2q + e at q * kWeightQuadStride + 2j + e)
// and a lane reads two groups with one 16-byte load instead of one group with an 8-byte load.
// Each run is padded by 16 bytes so that the four quads' loads of one warp fall in different
// banks. Otherwise the weights are in column order.
#ifndef WEIGHT_PAIR_LOADS
#define WEIGHT_PAIR_LOADS 0
#endif
constexpr bool kWeightPairLoads = WEIGHT_PAIR_LOADS != 0;
static_assert(!kWeightPairLoads || EPI_DTYPE == 0, "paired weight loads are for the float32 epilogue");
constexpr int kWeightQuadStride = kN / 4 + 4;  // floats
constexpr int kWeightSlotFloats = kWeightPairLoads ? 4 * kWeightQuadStride : kN;
static_assert(kWeightQuadStride % 4 == 0 && (kN / 8) % 2 == 0, "16-byte weight loads of group pairs");

[[maybe_unused]] __device__ __forceinline__ int weight_position(int column) {  // unused with TC_HEAD_SUM
  return kWeightPairLoads ? (column % 8 / 2) * kWeightQuadStride + column / 8 * 2 + column % 2 : column;
}

// TC_HEAD_SUM: per q slot, the head sum's B operand: 8 rows (output columns) of kN bfloat16
// (K = the q rows), K-major in 128-byte swizzle atoms of 8 rows x 64 values (atom a: K in
// [64a, 64a + 64), at a * 1024). Slot t's weights are row 2t of atom t; everything else is 0,
// written once at kernel start.
constexpr int kHeadSumSlotBytes = TC_HEAD_SUM ? 8 * kN * 2 : 0;
static_assert(!TC_HEAD_SUM || (EPI_DTYPE == 2 && NUM_HEADS == 64 && kNHalf % 16 == 0),
              "the tensor-core head sum: bfloat16 epilogue, 64 heads (one atom per draft slot)");

struct SharedLayout {
  static constexpr int kQ = 0;  // 1024-byte aligned for the 128-byte swizzle
  static constexpr int kHeadSum = kQ + 2 * kQSlotBytes;  // 1024-byte aligned too
  static constexpr int kKv = kHeadSum + 2 * kHeadSumSlotBytes;
  static constexpr int kWeights = kKv + NUM_STAGES * kKvTileBytes;
  static constexpr int kHeadScale = kWeights + 2 * kWeightSlotFloats * 4;
  static constexpr int kSlotExp = kHeadScale + 2 * kN * 4;
  static constexpr int kLut = kSlotExp + 2 * 4 * 4;
  static constexpr int kScales = kLut + kLutLevels * 8;
  static constexpr int kBarriers = kScales + NUM_STAGES * kScaleBytes;
  static constexpr int kBytes = kBarriers + Barriers::kBytes;
};
// The dynamic shared memory the launcher asks for (the config's `shared_memory_bytes`, which
// mirrors this layout by hand) must hold the layout after the base is rounded up to 1024 bytes.
static_assert(SharedLayout::kBytes + 1024 <= SHARED_BYTES,
              "the config's shared_memory_bytes is smaller than this kernel's SharedLayout");

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t selector) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(selector));
  return r;
}

__device__ __forceinline__ int max_byte(uint32_t word) {
  const int b0 = word & 0xff, b1 = (word >> 8) & 0xff, b2 = (word >> 16) & 0xff, b3 = word >> 24;
  return max(max(b0, b1), max(b2, b3));
}

// Two unsigned 16-bit lanes at once (native on SM90: one VIMNMX).
__device__ __forceinline__ uint32_t max_u16x2(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("max.u16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
__device__ __forceinline__ uint32_t min_u16x2(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("min.u16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}

// Eight E2M1 nibbles (element i in bits [4i, 4i+4)) -> eight E4M3 bytes via the group's
// 8-entry magnitude table `lut` (byte c = E4M3 of code c's value times 2^(6 - d), bit 7 clear).
// lo gets elements 0..3, hi elements 4..7 (byte i = element i). prmt picks each magnitude with
// the nibble's 3 code bits (the sign bit masked off: it would select prmt's sign-replicate
// mode). Signs: an odd nibble's sign is bit 7 of its byte of `packed`, an even nibble's is
// bit 7 of the same byte of packed << 4, so one byte permute of the two words lines every
// element's sign up with bit 7 of its output byte. 9 instructions per 8 values.
__device__ __forceinline__ void decode_e2m1x8(uint32_t packed, uint2 lut, uint32_t& lo, uint32_t& hi) {
  const uint32_t codes = packed & 0x77777777u;
  const uint32_t mag_lo = prmt(lut.x, lut.y, codes);
  const uint32_t mag_hi = prmt(lut.x, lut.y, codes >> 16);
  const uint32_t shifted = packed << 4;
  // Byte selectors over {shifted (bytes 0-3), packed (bytes 4-7)}: elements 0..3 take their
  // signs from shifted.b0, packed.b0, shifted.b1, packed.b1; elements 4..7 from bytes 2 and 3.
  const uint32_t signs_lo = prmt(shifted, packed, 0x5140u);
  const uint32_t signs_hi = prmt(shifted, packed, 0x7362u);
  lo = mag_lo | (signs_lo & 0x80808080u);
  hi = mag_hi | (signs_hi & 0x80808080u);
}

// Where the decoded bytes go. A thread's A fragment holds, per k step s (32 logical columns),
// columns 4q..4q+3 and 16+4q..16+4q+3 (q = lane % 4) of its two rows. Thread q takes
// physical group q of its rows and word s of that group (elements 8s..8s+7): lo -> logical
// columns 32s + 4q + i, hi -> 32s + 16 + 4q + i. Any permutation of the 128 columns is fine
// as long as q uses the same one, which the producer's decode does with this function.
__device__ __forceinline__ int logical_column(int group, int word, bool high) {
  return 32 * word + (high ? 16 : 0) + 4 * group;
}

// Byte offset of (row, byte) in a 128-byte-swizzled K-major tile (TMA/WGMMA 128B swizzle:
// the 16-byte unit index is XORed with row % 8).
__device__ __forceinline__ uint32_t swizzled_128(uint32_t row, uint32_t byte) {
  return row * 128 + ((((byte >> 4) ^ row) & 7) << 4) + (byte & 15);
}

__device__ __forceinline__ void build_lut(uint8_t* lut) {
  // Thread i writes entry (d = i / 8, code c = i % 8): E2M1 value of c times 2^(6 - d), RNE to
  // E4M3 (exact for d <= 14, see the header comment).
  for (int i = threadIdx.x; i < kLutLevels * 8; i += blockDim.x) {
    const int code = i % 8;  // 0, 0.5, then (1 or 1.5) * 2^(code/2 - 1)
    const float e2m1 = code < 2 ? 0.5f * code : ldexpf(code & 1 ? 1.5f : 1.f, code / 2 - 1);
    const float value = ldexpf(e2m1, 6 - i / 8);
    lut[i] = static_cast<uint8_t>(__nv_cvt_float_to_fp8(value, __NV_SATFINITE, __NV_E4M3));
  }
}

// The anchor R_t of draft slot t's folded weights (float32 and tensor-core epilogues): the
// slot's sums are sum_h w'_h relu(acc_h) with w'_h = w_h 2^(Mq_h - R_t), times 2^(M + R_t - 266)
// at the end. Any R_t gives the definition's value; R_t decides which heads stay in float32's
// range. Let A = max over the slot's finite nonzero weights of ilogb(w_h) + Mq_h. Then:
//  * R_t >= A - kFoldHeadroom keeps |w'_h| < 2^95 and, with |acc| <= 128 * 384^2 < 2^24.2
//    (2^25.2 doubled by RELU_FORM 1), every slot sum of 64 heads below 2^126.2: the scaled sums
//    cannot overflow where the result does not (weights up to float32's largest included);
//  * as low as that allows, a head stays normal while its |w_h| 2^Mq_h is within about 2^220
//    of the slot's largest, so a head the largest ones dwarf still counts on tokens where their
//    ReLU is zero (the previous anchor, max_h Mq_h, lost it beyond about 2^126);
//  * R_t in [kMinAnchor, kMaxAnchor] keeps the final exponent e = M + R_t - 266 (- 1) in
//    [-252, 254] for every M in [0, 255], so scale_by_pow2_from needs no clamp and its two
//    factors are normal floats. Where kMaxAnchor binds (A > 359, weights beyond 2^105) a sum
//    can overflow only if the logit is at least 2^126.
// Every R_t is a power-of-two rescaling of the same float32 sums, so the results are bitwise the
// previous anchor's wherever neither leaves float32's normal range.
constexpr int kFoldHeadroom = 94, kMinAnchor = 15, kMaxAnchor = 265;
[[maybe_unused]] __device__ __forceinline__ int fold_anchor(float w_a, int exp_a, float w_b, int exp_b) {
  const auto weighted_exponent = [](float w, int exp) {  // zero, inf and NaN weights: no say
    return isfinite(w) && w != 0.f ? ilogbf(w) + exp : -1000;
  };
  const int largest = __reduce_max_sync(0xffffffffu, max(weighted_exponent(w_a, exp_a), weighted_exponent(w_b, exp_b)));
  return min(max(largest - kFoldHeadroom, kMinAnchor), kMaxAnchor);
}

// scale_by_pow2 for e = M + R_t - 266 - kTwiceRelu (the float32 epilogue) or M + R_t - 266
// (TC_HEAD_SUM), which fold_anchor's bounds keep in [-252, 254]: one shift (floor(e / 2)) and
// two exact power-of-two multiplies.
[[maybe_unused]] __device__ __forceinline__ float scale_by_pow2_from(float x, int e) {  // unused with float16
  const int low = e >> 1;
  return x * __int_as_float((low + 127) << 23) * __int_as_float((e - low + 127) << 23);
}

__device__ __forceinline__ uint2 lut_for(const uint2* luts, int max_exponent, int exponent) {
  return luts[min(max_exponent - exponent, kLutLevels - 1)];
}

// A consumer thread decodes group `quad` of two rows (tokens); the quad's four lanes hold the
// four groups. Returns the rows' largest exponents M (row 0 in bits 0-15, row 1 in 16-31)
// and sets both rows' tables for M - e. The maxima come from the quad's lanes (two shuffles)
// rather than from each scale word's four bytes: 7 integer-pipe instructions for both rows
// instead of about 24.
__device__ __forceinline__ uint32_t row_tables(uint32_t sf0, uint32_t sf1, uint32_t exponent_selector,
                                               const uint2* luts, uint2& lut0, uint2& lut1) {
  const uint32_t exponents = prmt(sf0, sf1, exponent_selector) & 0x00ff00ffu;
  uint32_t maxima = max_u16x2(exponents, __shfl_xor_sync(0xffffffffu, exponents, 1));
  maxima = max_u16x2(maxima, __shfl_xor_sync(0xffffffffu, maxima, 2));
  // M >= e in each half, so one 32-bit subtraction subtracts both halves.
  const uint32_t levels = min_u16x2(maxima - exponents, (kLutLevels - 1) * 0x00010001u);
  lut0 = luts[levels & 0xffffu];
  lut1 = luts[levels >> 16];
  return maxima;
}

// Decode request b's q (kN rows of 64 packed bytes + one scale word) into a q slot, and write
// the slot's folded weights (TC_HEAD_SUM: into the head-sum tile), head scales and
// per-draft-slot anchors R_t (Q_t for the float16 epilogue). Called by every staging warp
// with its `part`: rows part*32 + lane + i*32*kStagingWarps, then (after the staging warps'
// barrier) draft slots t = part, part + kStagingWarps, ...
__device__ __forceinline__ void stage_q(int b, int part, const uint8_t* q, const uint32_t* q_sf,
                                        const float* weights, const uint2* luts, uint8_t* q_dst,
                                        float* weight_dst, float* head_scale_dst, int* slot_exp_dst,
                                        uint8_t* head_sum_dst) {
  const int lane = threadIdx.x % 32;
  // Each row's largest group exponent is parked in head_scale_dst (as an int) until the slot
  // maxima are known.
  int* row_exp = reinterpret_cast<int*>(head_scale_dst);
#pragma unroll 1
  for (int row = part * 32 + lane; row < kN; row += 32 * kStagingWarps) {
    const long long global_row = static_cast<long long>(b) * kN + row;
    const uint4* src = reinterpret_cast<const uint4*>(q + global_row * kRowBytes);
    uint4 packed[kGroups];  // the whole row in one round trip
#pragma unroll
    for (int g = 0; g < kGroups; ++g) packed[g] = src[g];
    const uint32_t sf = q_sf[global_row];
    const int row_max = max_byte(sf);
    row_exp[row] = row_max;
#pragma unroll
    for (int g = 0; g < kGroups; ++g) {
      const uint2 lut = lut_for(luts, row_max, (sf >> (8 * g)) & 0xff);
      const uint32_t words[4] = {packed[g].x, packed[g].y, packed[g].z, packed[g].w};
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        uint32_t lo, hi;
        decode_e2m1x8(words[s], lut, lo, hi);
        *reinterpret_cast<uint32_t*>(q_dst + swizzled_128(row, logical_column(g, s, false))) = lo;
        *reinterpret_cast<uint32_t*>(q_dst + swizzled_128(row, logical_column(g, s, true))) = hi;
      }
    }
  }
  staging_warps_sync();  // every row's exponent is parked before the slot maxima
#pragma unroll 1
  for (int t = part; t < NEXT_N; t += kStagingWarps) {
    // With H = 64, draft slot t owns rows t*64 + lane and t*64 + lane + 32.
    const int row_a = t * NUM_HEADS + lane, row_b = row_a + 32;
    const int exp_a = row_exp[row_a], exp_b = row_exp[row_b];
    const float w_a = weights[static_cast<long long>(b) * kN + row_a];
    const float w_b = weights[static_cast<long long>(b) * kN + row_b];
#if EPI_DTYPE == 0 || TC_HEAD_SUM
    // Folded weights w'_h = w_h * 2^(Mq_h - R_t), exact where normal; see fold_anchor. Mq_h - R_t
    // reaches -265, past scale_by_pow2's clamp (which overstated a weight near 2^127 by up to
    // 2^13), so ldexpf: once per head and request.
    const int anchor = fold_anchor(w_a, exp_a, w_b, exp_b);
    const float folded_a = ldexpf(w_a, exp_a - anchor), folded_b = ldexpf(w_b, exp_b - anchor);
#else
    const int anchor = __reduce_max_sync(0xffffffffu, max(exp_a, exp_b));  // Q_t
    const float scale_a = ldexpf(1.f, exp_a - anchor), scale_b = ldexpf(1.f, exp_b - anchor);  // in (0, 1]
#endif
    if (lane == 0) slot_exp_dst[t] = anchor;
    __syncwarp();  // every lane has read row_exp before it is overwritten
#if TC_HEAD_SUM
    // Row 2t of atom t, K = head (lane and lane + 32); w'_h is w_h times a power of two, so this
    // rounds like bfloat16(w_h) times that power where w'_h is normal.
    uint8_t* atom = head_sum_dst + t * 1024;
    *reinterpret_cast<__nv_bfloat16*>(atom + swizzled_128(2 * t, 2 * lane)) = __float2bfloat16_rn(folded_a);
    *reinterpret_cast<__nv_bfloat16*>(atom + swizzled_128(2 * t, 2 * lane + 64)) = __float2bfloat16_rn(folded_b);
#else
#if EPI_DTYPE == 0
    weight_dst[weight_position(row_a)] = folded_a;
    weight_dst[weight_position(row_b)] = folded_b;
#else
    // Rounded once per request here rather than once per unit by every consumer.
    reinterpret_cast<Epi*>(weight_dst)[row_a] = to_epi(w_a);
    reinterpret_cast<Epi*>(weight_dst)[row_b] = to_epi(w_b);
    head_scale_dst[row_a] = scale_a;  // read by the float16 epilogue only
    head_scale_dst[row_b] = scale_b;
#endif
#endif
  }
}

__device__ __forceinline__ void producer(const TensorMap& kv_map, const uint8_t* kv_base, long long kv_block_stride,
                                         const uint8_t* q, const uint32_t* q_sf, const float* weights,
                                         const int* block_tables, long long block_table_stride, int num_blocks,
                                         UnitWalker walk, uint8_t* smem, long long* phases) {
  uint8_t* kv_tiles = smem + SharedLayout::kKv;
  uint8_t* q_slots = smem + SharedLayout::kQ;
  float* weight_slots = reinterpret_cast<float*>(smem + SharedLayout::kWeights);
  float* head_scale_slots = reinterpret_cast<float*>(smem + SharedLayout::kHeadScale);
  int* slot_exp = reinterpret_cast<int*>(smem + SharedLayout::kSlotExp);
  const uint2* luts = reinterpret_cast<const uint2*>(smem + SharedLayout::kLut);
  uint8_t* scales = smem + SharedLayout::kScales;
  const Barriers bars(smem + SharedLayout::kBarriers);

  auto stage_request_q = [&](int b, int slot, int part) {
    stage_q(b, part, q, q_sf, weights, luts, q_slots + slot * kQSlotBytes, weight_slots + slot * kWeightSlotFloats,
            head_scale_slots + slot * kN, slot_exp + slot * 4, smem + SharedLayout::kHeadSum + slot * kHeadSumSlotBytes);
  };
  auto issue = [&](int stage, const UnitWalker& unit, const int (&block_ids)[kBoxesPerTile], int boxes) {
    const int scale_bytes = SF_INTERLEAVED ? (boxes > 0 ? kScaleBytes : 0) : boxes * kBoxRows * 4;
    mbar_arrive_expect_tx(&bars.full[stage], boxes * kBoxRows * kRowBytes + scale_bytes);
#pragma unroll
    for (int s = 0; s < kBoxesPerTile; ++s) {
      if (block_ids[s] < 0) continue;
      const int row_in_block = (unit.u * kTile + s * kBoxRows) % BLOCK_SIZE;
      tma_load_3d(kv_tiles + stage * kKvTileBytes + s * kBoxRows * kRowBytes, &kv_map, &bars.full[stage], 0,
                  row_in_block, block_ids[s]);
      const uint8_t* scale_region = kv_base + block_ids[s] * kv_block_stride + BLOCK_SIZE * kRowBytes;
      if (SF_INTERLEAVED) {
        bulk_load(scales + stage * kScaleBytes, scale_region, kScaleBytes, &bars.full[stage]);
      } else {
        bulk_load(scales + stage * kScaleBytes + s * kBoxRows * 4, scale_region + row_in_block * 4, kBoxRows * 4,
                  &bars.full[stage]);
      }
    }
  };
  run_producer(walk, block_tables, block_table_stride, num_blocks, bars, stage_request_q, issue,
               EXP_PHASES ? phases + kPhaseSlotsPerCta * blockIdx.x + kProducerPhaseSlots : nullptr);
}

// The scale words (four UE8M0 bytes each) of rows `row0` and `row0 + 8` of unit `u`, where
// row0 % 16 < 8 (a consumer lane's two rows).
__device__ __forceinline__ void token_scales(const uint8_t* stage_scales, int u, int row0, uint32_t& sf0,
                                             uint32_t& sf1) {
  const uint32_t* words = reinterpret_cast<const uint32_t*>(stage_scales);
  if (SF_INTERLEAVED) {
    // Slot s of a 128-token block holds token (s % 4) * 32 + s / 4, so token t sits in slot
    // 4 * (t % 32) + t / 32. Unit u covers tokens 64 * (u % 2) + [0, 64), and 64 is a multiple
    // of 32, so its row r sits in slot 4 * (r % 32) + r / 32 + 2 * (u % 2): only the last term
    // changes from unit to unit. As row0 % 32 < 24, row0 + 8 sits 32 slots after row0.
    const unsigned r = static_cast<unsigned>(row0);
    const unsigned slot = 4 * (r % 32) + r / 32 + 2 * (static_cast<unsigned>(u) & 1);
    sf0 = words[slot];
    sf1 = words[slot + 32];
  } else {
    sf0 = words[row0];
    sf1 = words[row0 + 8];
  }
}

__device__ __forceinline__ void consumer(int consumer_index, Out* out, long long out_stride, UnitWalker walk,
                                         uint8_t* smem, long long* phases) {
  const int warp_in_group = (threadIdx.x / 32) % 4;
  const int lane = threadIdx.x % 32;
  const int quad = lane % 4;                       // column pair of each 8-column group; KV group
  const int row0 = 16 * warp_in_group + lane / 4;  // this thread's rows: row0 and row0 + 8
  // prmt selector: byte `quad` (group quad's exponent) of each row's scale word into bytes 0 and 2.
  const uint32_t exponent_selector = quad | (4 + quad) << 8;
  const uint8_t* kv_tiles = smem + SharedLayout::kKv;
  const uint8_t* q_slots = smem + SharedLayout::kQ;
#if !TC_HEAD_SUM
  const float* weight_slots = reinterpret_cast<const float*>(smem + SharedLayout::kWeights);
#endif
#if !TC_HEAD_SUM && EPI_DTYPE != 0
  const float* head_scale_slots = reinterpret_cast<const float*>(smem + SharedLayout::kHeadScale);
#endif
  const int* slot_exp = reinterpret_cast<const int*>(smem + SharedLayout::kSlotExp);
  const uint2* luts = reinterpret_cast<const uint2*>(smem + SharedLayout::kLut);
  const uint8_t* scales = smem + SharedLayout::kScales;
  const Barriers bars(smem + SharedLayout::kBarriers);
  float acc[kHalves][Mma::kRegs];
  unsigned issued = 0, mma_done = 0;  // EXP_PHASES: clock() after the MMA issue, after the last wait
  if (EXP_SKIP_MMA) {
#pragma unroll
    for (int h = 0; h < kHalves; ++h) {
#pragma unroll
      for (int i = 0; i < Mma::kRegs; ++i) acc[h][i] = 0.f;
    }
  }

  // The part of the final exponent M + R_t - 266 of this lane's k-th slot sum that does not
  // depend on the token (float32 epilogue). Lanes whose t = 2k + (quad >> 1) is past NEXT_N
  // store nothing (SlotSums::stores) and read a meaningless entry of the slot's 4.
  auto slot_exponent_of = [&](int slot, int k) { return slot_exp[slot * 4 + 2 * k + (quad >> 1)] - 266 - kTwiceRelu; };
  // Per request: this lane's first output (a unit adds u * kTile) and its slot exponents, which
  // takes 16 SASS instructions off each unit at next_n 1 (block 64, bfloat16 output, float32
  // epilogue, NVRTC 13.5: 236 against 252; the shorter scale_by_pow2_from is part of it). Not
  // at next_n 3, whose float32 epilogue has 96 accumulators in 144 registers: holding both
  // there spilled 4-8 bytes at block 32, so next_n 3 computes both per unit.
  constexpr bool kHoldRequest = NEXT_N != 3;
  Out* request_out = out;
  int slot_exponent[SlotSums::kLaneSums];
  auto enter_request = [&](const UnitWalker& request, int slot) {
    if (!kHoldRequest) return;
    // This lane's first output of the request: slot quad >> 1, column row0 + 8 * (quad & 1).
    request_out = out + (static_cast<long long>(request.b) * NEXT_N + (quad >> 1)) * out_stride + row0 + 8 * (quad & 1);
#pragma unroll
    for (int k = 0; k < SlotSums::kLaneSums; ++k) slot_exponent[k] = slot_exponent_of(slot, k);
  };

  auto process = [&](int stage, int slot, const UnitWalker& unit) {
    // Both rows' packed group `quad` and scale words, then the stage goes back to the producer.
    const uint8_t* tile = kv_tiles + stage * kKvTileBytes;
    const uint4 packed0 = *reinterpret_cast<const uint4*>(tile + row0 * kRowBytes + quad * 16);
    const uint4 packed1 = *reinterpret_cast<const uint4*>(tile + (row0 + 8) * kRowBytes + quad * 16);
    uint32_t sf0, sf1;
    token_scales(scales + stage * kScaleBytes, unit.u, row0, sf0, sf1);
    mbar_arrive(&bars.empty[stage]);
    // This lane's first output of the unit: slot quad >> 1 (next_n 3: slot 0), row row0 + 8 * (quad & 1).
    Out* out_unit = kHoldRequest ? request_out + unit.u * kTile
                                 : out + static_cast<long long>(unit.b) * NEXT_N * out_stride +
                                       (static_cast<long long>(unit.u) * kTile + row0 + 8 * (quad & 1));
    if (EXP_SKIP_MATH) {
      if (quad == 0) out_unit[0] = to_out(__uint_as_float(packed0.x ^ packed1.y ^ sf0 ^ sf1));
      return;
    }

    uint2 lut0, lut1;
    const uint32_t maxima = row_tables(sf0, sf1, exponent_selector, luts, lut0, lut1);
    const uint32_t words0[4] = {packed0.x, packed0.y, packed0.z, packed0.w};
    const uint32_t words1[4] = {packed1.x, packed1.y, packed1.z, packed1.w};
    uint32_t a[4][4];
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      if (EXP_SKIP_DECODE) {
        a[s][0] = words0[s], a[s][1] = words1[s], a[s][2] = words0[s] ^ lut0.x, a[s][3] = words1[s] ^ lut1.y;
      } else {
        decode_e2m1x8(words0[s], lut0, a[s][0], a[s][2]);
        decode_e2m1x8(words1[s], lut1, a[s][1], a[s][3]);
      }
    }

    // One commit group per half of the N columns (half h: q rows [h * kNHalf, (h + 1) * kNHalf)).
    // The B descriptors come from the slot made warp-uniform (see warp_uniform), so ptxas builds
    // them in uniform registers: 6 R2UR fewer per unit at next_n 1, 15 at next_n 4 (block 64,
    // bfloat16 output, float32 epilogue, NVRTC 13.5).
    // At next_n 3 (96 accumulators, in 144 registers with the float32 epilogue) the slot first
    // goes through an empty asm: before warp_uniform, keeping what depends on it across units
    // spilled there; with it, the asm still saves 6 instructions per unit (444 against 450 at
    // block 64, bfloat16 output, float32 epilogue, NVRTC 13.5; SASS only).
    if (NEXT_N == 3) asm volatile("" : "+r"(slot));
#pragma unroll
    for (int h = 0; h < kHalves; ++h) {
#pragma unroll
      for (int i = 0; i < Mma::kRegs; ++i) reg_fence(acc[h][i]);
    }
    wgmma_fence();
    const uint64_t b_desc = smem_desc<128>(q_slots) + warp_uniform(slot) * (kQSlotBytes >> 4);
#pragma unroll
    for (int h = 0; h < kHalves; ++h) {
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        if (EXP_SKIP_MMA) {
          asm volatile("" ::"r"(a[s][0]), "r"(a[s][1]), "r"(a[s][2]), "r"(a[s][3]));  // keep the decode
        } else {
          Mma::mma_rs(acc[h], a[s], smem_desc_advance(b_desc, h * kNHalf * kQRowBytes + s * 32), s != 0);
        }
      }
      wgmma_commit();
    }
    if (EXP_PHASES) issued = clock();

    if (EXP_SKIP_EPILOGUE) {
      wgmma_wait<0>();
      if (quad == 0) out_unit[0] = to_out(acc[0][0] + acc[kHalves - 1][Mma::kRegs - 1]);
      return;
    }

#if TC_HEAD_SUM
    // The head sums on the tensor cores (TC_HEAD_SUM above). Per half, as its MMA group
    // completes: relu(acc) packed to bfloat16 pairs, which are already the A fragments of
    // k steps 16k .. 16k + 15 (wgmma_bf16_m64n8k16_rs), then kNHalf / 16 MMAs of N = 8 into one
    // chain. The wait keeps one group pending: the second half's MMA before the first half's
    // head sum, the first half's head sum before the second's.
    float head_sums[4];
    uint32_t relu_scores[kN / 16][4];
    const uint64_t sum_desc = smem_desc<128>(smem + SharedLayout::kHeadSum) + warp_uniform(slot) * (kHeadSumSlotBytes >> 4);
#pragma unroll
    for (int h = 0; h < kHalves; ++h) {
      wgmma_wait<kHalves - 1>();
#pragma unroll
      for (int i = 0; i < Mma::kRegs; ++i) reg_fence(acc[h][i]);
#pragma unroll
      for (int kk = 0; kk < kNHalf / 16; ++kk) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const __nv_bfloat162 pair = relu_pack(acc[h][8 * kk + 2 * r], acc[h][8 * kk + 2 * r + 1]);
          relu_scores[h * (kNHalf / 16) + kk][r] = *reinterpret_cast<const uint32_t*>(&pair);
        }
      }
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kNHalf / 16; ++kk) {
        const int ks = h * (kNHalf / 16) + kk;  // K = q rows 16 ks .. 16 ks + 15: atom ks / 4, 32 bytes each
        wgmma_bf16_m64n8k16_rs(head_sums, relu_scores[ks], smem_desc_advance(sum_desc, ks / 4 * 1024 + ks % 4 * 32),
                               ks != 0);
      }
      wgmma_commit();
    }
    wgmma_wait<0>();
    if (EXP_PHASES) mma_done = clock();
#pragma unroll
    for (int i = 0; i < 4; ++i) reg_fence(head_sums[i]);
    // Column 2 quad is draft slot quad: head_sums[0] its sum for row row0, head_sums[2] for
    // row0 + 8, each times 2^(M + R_t - 266).
    if (quad < NEXT_N) {
      const int exponent = slot_exp[slot * 4 + quad] - 266;
      Out* slot_out = out + (static_cast<long long>(unit.b) * NEXT_N + quad) * out_stride +
                      (static_cast<long long>(unit.u) * kTile + row0);
      slot_out[0] = to_out(scale_by_pow2_from(head_sums[0], static_cast<int>(maxima & 0xffffu) + exponent));
      slot_out[8] = to_out(scale_by_pow2_from(head_sums[2], static_cast<int>(maxima >> 16) + exponent));
    }
#else
    // Epilogue, half by half as the MMA groups complete (no lane-dependent branch until the
    // last wait: ptxas serializes wgmmas in flight across one). float32: the folded weights w'
    // (head scales inside) times relu(acc), summed, then 2^(M + R_t - 266) once (two exact
    // power-of-two multiplies). float16/bfloat16: each head score is formed in float32 at its
    // true scale before the conversion, so the reduced-precision sums see the same numbers as
    // the definition (and overflow where it would) while M + Q_t is in [156, 367].
    const float* w = weight_slots + slot * kWeightSlotFloats;
    SlotSums sums;
    sums.clear();
#if EPI_DTYPE != 0
    const float* head_scale = head_scale_slots + slot * kN;
    const int* q_exp = slot_exp + slot * 4;
    const int max0 = maxima & 0xffffu, max1 = maxima >> 16;
    float token_scale[NEXT_N][2];
#pragma unroll
    for (int t = 0; t < NEXT_N; ++t) {
      token_scale[t][0] = fminf(scale_by_pow2(1.f, max0 + q_exp[t] - 266), 3.4028235e38f);
      token_scale[t][1] = fminf(scale_by_pow2(1.f, max1 + q_exp[t] - 266), 3.4028235e38f);
    }
#endif
#if EPI_DTYPE != 0
    // 16-bit epilogues: a thread's two columns of a row stay one packed pair (one F2FP with
    // the ReLU folded in, one HFMA2), summed per draft slot and row; the pair's halves are
    // added at the end. (H = 64: an 8-column group never straddles two draft slots.)
    Epi2 pair_sums[NEXT_N][2];
#pragma unroll
    for (int t = 0; t < NEXT_N; ++t) pair_sums[t][0] = pair_sums[t][1] = to_epi2(0.f, 0.f);
#endif
#pragma unroll
    for (int h = 0; h < kHalves; ++h) {
      if (h == kHalves - 1) {
        wgmma_wait<0>();
        if (EXP_PHASES) mma_done = clock();
      } else {
        wgmma_wait<kHalves - 1>();
      }
#pragma unroll
      for (int i = 0; i < Mma::kRegs; ++i) reg_fence(acc[h][i]);
#if EPI_DTYPE == 0
      float4 wq;  // kWeightPairLoads: this lane's weights of groups j and j + 1 (jl even)
#endif
#pragma unroll
      for (int jl = 0; jl < kNHalf / 8; ++jl) {
        const int j = h * (kNHalf / 8) + jl;  // 8-column group of the unit's N columns
        const int column = 8 * j + 2 * quad;
#if EPI_DTYPE == 0
        float2 wf;
        if (!kWeightPairLoads) {
          wf = *reinterpret_cast<const float2*>(w + column);
        } else if (jl % 2 == 0) {  // kNHalf / 8 is even, so a half's groups pair up
          wq = *reinterpret_cast<const float4*>(w + quad * kWeightQuadStride + 2 * j);
          wf = make_float2(wq.x, wq.y);
        } else {
          wf = make_float2(wq.z, wq.w);
        }
        const Epi w0 = wf.x, w1 = wf.y;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const Epi x0 = acc[h][4 * jl + 2 * i], x1 = acc[h][4 * jl + 2 * i + 1];
          sums.add_weighted(j, i, quad, w0, x0, w1, x1);
        }
#else
        const Epi2 w2 = *reinterpret_cast<const Epi2*>(reinterpret_cast<const Epi*>(w) + column);
        const float2 hs = *reinterpret_cast<const float2*>(head_scale + column);
        const int t = column / NUM_HEADS;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const float x0 = acc[h][4 * jl + 2 * i] * hs.x * token_scale[t][i];
          const float x1 = acc[h][4 * jl + 2 * i + 1] * hs.y * token_scale[t][i];
          pair_sums[t][i] = __hfma2(w2, relu_pack(x0, x1), pair_sums[t][i]);
        }
#endif
      }
    }
#if EPI_DTYPE != 0
#pragma unroll
    for (int t = 0; t < NEXT_N; ++t) {
#pragma unroll
      for (int i = 0; i < 2; ++i) sums.partial[t][i] = pair_sums[t][i].x + pair_sums[t][i].y;
    }
#endif
    sums.reduce_quad(quad);
#if EPI_DTYPE == 0
    const int row_max = quad & 1 ? maxima >> 16 : maxima & 0xffffu;  // M of this lane's row
#endif
    Out* slot_out = kHoldRequest ? out_unit : out_unit + (quad >> 1) * out_stride;  // slot 2k + (quad >> 1), k = 0
#pragma unroll
    for (int k = 0; k < SlotSums::kLaneSums; ++k, slot_out += 2 * out_stride) {
      if (SlotSums::stores(k, quad)) {
#if EPI_DTYPE == 0
        if (kHoldRequest) {
          *slot_out = to_out(scale_by_pow2_from(sums.lane_sums[k], row_max + slot_exponent[k]));
        } else {
          const int* q_exp = slot_exp + slot * 4;
          // e reaches 253 (M 255, R_t 265, kTwiceRelu 1), past scale_by_pow2's clamp;
          // fold_anchor keeps it in scale_by_pow2_from's range.
          *slot_out = to_out(scale_by_pow2_from(sums.lane_sums[k], row_max + q_exp[2 * k + (quad >> 1)] - 266 - kTwiceRelu));
        }
#else
        *slot_out = to_out(to_float(sums.lane_sums[k]));
#endif
      }
    }
#endif
  };
  if (!EXP_PHASES) {
    run_consumer(consumer_index, walk, bars, process, enter_request);
    return;
  }
  ConsumerPhases timing;
  run_consumer(
      consumer_index, walk, bars,
      [&](int stage, int slot, const UnitWalker& unit) {
        const unsigned start = clock();
        process(stage, slot, unit);
        timing.unit(start, issued, mma_done, clock());
      },
      enter_request);
  timing.store(phases, consumer_index);
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads, 1)
fp4_paged_mqa_logits_sm90(const __grid_constant__ TensorMap kv_map, const uint8_t* kv_base,
                          long long kv_block_stride, const uint8_t* q, const uint32_t* q_sf,
                          const float* weights, const int* block_tables, long long block_table_stride,
                          const int* seq_lens, long long seq_lens_stride, const int* schedule,
                          int* schedule_rows_out, int batch_size, int max_seq_len, int num_blocks, Out* out,
                          long long out_stride) {
  // The next kernel may be launched now: it waits for this grid before it reads anything.
  pdl_launch_dependents();
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* smem = aligned_smem(smem_raw);
  build_lut(smem + SharedLayout::kLut);
  if (TC_HEAD_SUM) {
    // The head-sum tiles' zeros (stage_q only ever writes each slot's row of weights), for the
    // tensor cores: generic stores, fenced before the block-wide barrier below.
    uint4* tiles = reinterpret_cast<uint4*>(smem + SharedLayout::kHeadSum);
    for (int i = threadIdx.x; i < 2 * kHeadSumSlotBytes / 16; i += blockDim.x) tiles[i] = make_uint4(0, 0, 0, 0);
    fence_proxy_async_smem();
  }
  const Barriers bars(smem + SharedLayout::kBarriers);
  if (threadIdx.x == 0) {
    prefetch_tensor_map(&kv_map);
    bars.init();
  }
  // No global memory is read or written before this point: with PDL this kernel may start
  // while the previous one is still writing q, seq_lens, the block table or the output.
  pdl_wait();
  // `schedule` null: derive this CTA's range from seq_lens here (see schedule_rows); the scan's
  // scratch is stage 0's KV tile, which no copy has touched yet.
  const int* rows = schedule_rows(schedule, seq_lens, seq_lens_stride, batch_size,
                                  EXP_PHASES ? nullptr : schedule_rows_out, bars.schedule_rows,
                                  smem + SharedLayout::kKv);
  __syncthreads();

  UnitWalker walk;
  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {
    Registers::enter_producer();
    if (threadIdx.x < 32 * NUM_PRODUCERS) {
      walk.start(rows, seq_lens, seq_lens_stride, batch_size, max_seq_len, schedule == nullptr);
      producer(kv_map, kv_base, kv_block_stride, q, q_sf, weights, block_tables, block_table_stride, num_blocks, walk,
               smem, reinterpret_cast<long long*>(schedule_rows_out));
    }
  } else {
    Registers::enter_consumer();
    walk.start(rows, seq_lens, seq_lens_stride, batch_size, max_seq_len, schedule == nullptr);
    consumer(warpgroup - 1, out, out_stride, walk, smem, reinterpret_cast<long long*>(schedule_rows_out));
  }
}
