// Per-format dequantization routines behind dequantize() (tensor_type.h). Each converts
// `blocks` whole blocks from `src` to floats in `dst`. Internal to cleave_model.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cleave::model::dequant {

// Exact IEEE binary16 / bfloat16 / FP8 to binary32.
float halfToFloat(uint16_t bits);
float bf16ToFloat(uint16_t bits);
float fp8e4m3ToFloat(uint8_t bits);  // OCP E4M3 "fn": no infinities, S.1111.111 is NaN.
float fp8e5m2ToFloat(uint8_t bits);
// binary32 to binary16, rounded to nearest even (past 65504: infinity).
uint16_t floatToHalf(float value);

void q4_0(const uint8_t* src, float* dst, size_t blocks);
void q4_1(const uint8_t* src, float* dst, size_t blocks);
void q5_0(const uint8_t* src, float* dst, size_t blocks);
void q5_1(const uint8_t* src, float* dst, size_t blocks);
void q8_0(const uint8_t* src, float* dst, size_t blocks);
void mxfp4(const uint8_t* src, float* dst, size_t blocks);
// MXFP4's block scale for twice-valued codes: 2^(e - 128), exact (subnormal for e < 2).
float mxfp4Scale(uint8_t e);
// MXFP4's E2M1 codes as twice their value: 0, 1, 2, 3, 4, 6, 8, 12, then the negatives.
extern const int8_t kMxfp4Twice[16];
void nvfp4(const uint8_t* src, float* dst, size_t blocks);
// NVFP4's sub-block scale for twice-valued codes: half the unsigned E4M3 value of `d`'s low
// seven bits (bit 7 is ignored, but that 0x7F alone, E4M3's NaN, is 0: 0xFF is 240), exact.
float nvfp4Scale(uint8_t d);
// `blocks` x 32 floats as Q8_0 blocks: scale max|x| / 127 rounded to half, codes rounded to
// nearest (so within half a step, about max|x| / 254, of the floats).
void quantizeQ8_0(const float* src, uint8_t* dst, size_t blocks);
void q4_K(const uint8_t* src, float* dst, size_t blocks);
// Rewrites `blocks` Q4_K super-blocks as 8 x `blocks` Q4_1 blocks (20 bytes each) holding the
// same values up to the rounding of each sub-block's scale and offset to half; false when
// one of those overflows half.
bool q4_KAsQ4_1(const uint8_t* src, uint8_t* dst, size_t blocks);
void q5_K(const uint8_t* src, float* dst, size_t blocks);
void q6_K(const uint8_t* src, float* dst, size_t blocks);
void q8_K(const uint8_t* src, float* dst, size_t blocks);
// FP4 E2M1 (sign, 2 exponent bits, 1 mantissa bit: 0, 0.5, 1, 1.5, 2, 3, 4, 6); a block is
// one byte, low nibble first.
float e2m1ToFloat(uint8_t code);
void e2m1(const uint8_t* src, float* dst, size_t blocks);
// Offset-8 int4 pairs, low nibble first: value = nibble - 8.
void i4(const uint8_t* src, float* dst, size_t blocks);

}  // namespace cleave::model::dequant
