#!/usr/bin/env python3
"""Row-scaled NVFP4 as Transformer Engine's reference quantizer defines it, against nibble's bytes.

TE's reference (transformer_engine/pytorch/custom_recipes/reference_nvfp4.py, NVFP4QuantizerRef with
row_scaled_nvfp4=True, 1x16 tiles, no RHT) needs TE and CUDA-era PyTorch to import, so its arithmetic
is ported here to NumPy FP32, one operation at a time in its order, with codecs of this file's own
(E4M3 by nearest search over the 256 codes, E2M1 by TE's thresholds in cast_to_fp4x2):
  row amax     a_r = max_k |x[r, k]|                       (global_amax_row; x^T: per column of x)
  S_enc        min((448 * 6) / a_r, FLT_MAX), 1 where that is 0; S_dec = 1 / S_enc
  block scale  s = E4M3(clamp(min(b * (S_enc * (1/6)), FLT_MAX), -448, 448)), b the block amax
  multiplier   e = min(1 / (e4m3(s) * S_dec), FLT_MAX)
  code         E2M1(clamp(x * e, -6, 6))
Usage: row_scaled_nvfp4.py DIR, where DIR holds CASE_x.npy [rows, cols] and nibble's
CASE_codes.npy (one code per element), CASE_scales.npy, CASE_row_amax.npy, CASE_row_decode.npy
for every CASE listed in DIR/cases.txt. Exit 0 when every byte and scale agrees, 1 otherwise.
"""
import pathlib
import sys

import numpy as np

F32 = np.float32
FLT_MAX = np.finfo(np.float32).max


def e4m3_values():
    """The 256 E4M3 (fn) codes as float64; NaN for 0x7F / 0xFF."""
    vals = np.empty(256)
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        exp, man = (code >> 3) & 0xF, code & 0x7
        if exp == 0xF and man == 0x7:
            vals[code] = np.nan
        elif exp == 0:
            vals[code] = sign * man / 8.0 * 2.0**-6
        else:
            vals[code] = sign * (1 + man / 8.0) * 2.0 ** (exp - 7)
    return vals


E4M3 = e4m3_values()
E4M3_POSITIVE = E4M3[:0x7F]  # codes 0 .. 126: 0 .. 448, increasing with the code


def e4m3_rn(v):
    """Round non-negative FP32 values (<= 448) to the nearest E4M3 code, ties to the even code
    (an even mantissa). Distances are exact in float64."""
    v = np.asarray(v, dtype=np.float64)
    hi = np.clip(np.searchsorted(E4M3_POSITIVE, v), 1, 0x7E)
    lo = hi - 1
    d_lo, d_hi = v - E4M3_POSITIVE[lo], E4M3_POSITIVE[hi] - v
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0))
    return np.where(pick_hi, hi, lo).astype(np.uint8)


def e2m1_te(x):
    """TE's cast_to_fp4x2 thresholds, one code per element (not packed)."""
    out = np.zeros(x.shape, dtype=np.uint8)
    rules = [((x >= 0.0) & (x <= 0.25), 0), ((x > 0.25) & (x < 0.75), 1), ((x >= 0.75) & (x <= 1.25), 2),
             ((x > 1.25) & (x < 1.75), 3), ((x >= 1.75) & (x <= 2.5), 4), ((x > 2.5) & (x < 3.5), 5),
             ((x >= 3.5) & (x <= 5.0), 6), (x > 5.0, 7), ((x >= -0.25) & (x < -0.0), 8),
             ((x < -0.25) & (x > -0.75), 9), ((x <= -0.75) & (x >= -1.25), 10), ((x < -1.25) & (x > -1.75), 11),
             ((x <= -1.75) & (x >= -2.5), 12), ((x < -2.5) & (x > -3.5), 13), ((x <= -3.5) & (x >= -5.0), 14),
             (x < -5.0, 15)]
    for mask, code in rules:
        out[mask] = code
    return out


def te_row_scaled(x):
    """TE's _quantize_blockwise_reference with row_scaled_nvfp4, 1x16: (codes, scale bytes, row amax, S_dec)."""
    m, n = x.shape
    with np.errstate(divide="ignore", over="ignore"):
        row_amax = np.max(np.abs(x), axis=1).astype(F32)
        enc = F32(448.0 * 6.0) / row_amax                      # inf where the row is all zero
        enc = np.minimum(enc, F32(FLT_MAX)).astype(F32)
        enc = np.where(enc == F32(0), F32(1), enc).astype(F32)
        dec = (F32(1) / enc).astype(F32)
        mult = (enc * F32(1.0 / 6.0)).astype(F32)             # torch.reciprocal(6.0) in FP32
        blocks = x.reshape(m, n // 16, 16)
        vec_max = np.max(np.abs(blocks), axis=2).astype(F32)
        sdec = (vec_max * mult[:, None]).astype(F32)
        sdec = np.clip(np.minimum(sdec, F32(FLT_MAX)), F32(-448), F32(448)).astype(F32)
        scales = e4m3_rn(sdec)
        scale_values = E4M3[scales].astype(F32)
        mul = (F32(1) / (scale_values * dec[:, None]).astype(F32)).astype(F32)
        mul = np.minimum(mul, F32(FLT_MAX)).astype(F32)
        scaled = (blocks * mul[:, :, None]).astype(F32)
        clipped = np.clip(scaled, F32(-6), F32(6)).reshape(m, n)
    return e2m1_te(clipped), scales, row_amax, dec


def check(directory, case):
    x = np.load(directory / f"{case}_x.npy").astype(F32)
    codes, scales, row_amax, dec = te_row_scaled(x)
    got_codes = np.load(directory / f"{case}_codes.npy").astype(np.uint8)
    got_scales = np.load(directory / f"{case}_scales.npy").astype(np.uint8)
    got_amax = np.load(directory / f"{case}_row_amax.npy").astype(F32)
    got_dec = np.load(directory / f"{case}_row_decode.npy").astype(F32)
    problems = []
    # -0.0 inputs: TE's cast_to_fp4x2 gives code 0 (its `x >= 0.0` test holds for -0.0), nibble
    # keeps the sign (code 8, spec section 2). Both decode to zero; that is the only allowed
    # difference, and only there.
    negative_zero = (x == 0) & np.signbit(x)
    codes = np.where(negative_zero & (codes == 0) & (got_codes == 8), np.uint8(8), codes)
    if not np.array_equal(codes, got_codes):
        r, c = np.argwhere(codes != got_codes)[0]
        problems.append(f"code [{r},{c}]: TE {codes[r, c]}, nibble {got_codes[r, c]} (x {x[r, c]!r})")
    if not np.array_equal(scales, got_scales.reshape(scales.shape)):
        r, b = np.argwhere(scales != got_scales.reshape(scales.shape))[0]
        problems.append(f"scale [{r},{b}]: TE 0x{scales[r, b]:02X}, nibble 0x{got_scales.reshape(scales.shape)[r, b]:02X}")
    if not np.array_equal(row_amax.view(np.uint32), got_amax.view(np.uint32)):
        problems.append(f"row amax differs at row {int(np.argmax(row_amax != got_amax))}")
    # S_dec: equal on every row with a non-zero amax. An all-zero row has amax 0 in both (what TE
    # stores and its GEMM multiplies by); TE's S_dec there is 1/FLT_MAX, nibble's 1 (spec section 3),
    # and every byte of the row is 0 either way.
    nonzero = row_amax > 0
    if not np.array_equal(dec[nonzero].view(np.uint32), got_dec[nonzero].view(np.uint32)):
        problems.append("row S_dec differs on a non-zero row")
    if not np.all(got_dec[~nonzero] == F32(1)):
        problems.append("an all-zero row's S_dec is not 1")
    rows_checked, zero_rows = x.shape[0], int(np.sum(~nonzero))
    print(f"{case}: {x.shape[0]}x{x.shape[1]}, {rows_checked} rows ({zero_rows} all zero): "
          f"{'OK' if not problems else 'MISMATCH'}")
    for p in problems:
        print("  " + p)
    return not problems


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    directory = pathlib.Path(sys.argv[1])
    cases = (directory / "cases.txt").read_text().split()
    if not cases:
        print("no cases listed in cases.txt")
        return 1
    ok = all([check(directory, case) for case in cases])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
