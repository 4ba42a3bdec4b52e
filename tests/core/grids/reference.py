"""An independent, scalar, bit-level reference for every grid, written from the rules.

Nothing here uses torch's FP8 casts, ``log2`` or the library under test. Every value is an exact
integer pair ``(-1)^s · m · 2^e``; rounding to a binary float format (fp32, bf16, E4M3, E5M2) is
done by integer shifts with round-to-nearest-even, including subnormals, saturation and Inf. Inputs
and outputs are bit patterns (ints), so a comparison with the library is a comparison of bytes.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from fractions import Fraction


@dataclass(frozen=True)
class Fmt:
    ebits: int
    mbits: int
    bias: int
    ieee: bool  # True: all-ones exponent is Inf/NaN. False (E4M3 "fn"): only S.1111.111 is NaN

    @property
    def width(self) -> int:
        return 1 + self.ebits + self.mbits

    @property
    def top_exp(self) -> int:  # largest biased exponent of a finite value
        return (1 << self.ebits) - (2 if self.ieee else 1)

    @property
    def top_mant(self) -> int:  # largest mantissa at top_exp
        return (1 << self.mbits) - (1 if self.ieee else 2)

    def max_bits(self) -> int:
        return (self.top_exp << self.mbits) | self.top_mant

    def inf_bits(self) -> int:
        assert self.ieee
        return ((1 << self.ebits) - 1) << self.mbits

    def nan_bits(self, sign: int = 0) -> int:
        if self.ieee:
            payload = (((1 << self.ebits) - 1) << self.mbits) | (1 << (self.mbits - 1))
            if self.mbits == 2:  # torch's e5m2 NaN is S.11111.11
                payload |= 1
        else:
            payload = (1 << (self.ebits + self.mbits)) - 1
        return payload | (sign << (self.width - 1))


F32 = Fmt(8, 23, 127, True)
BF16 = Fmt(8, 7, 127, True)
E4M3 = Fmt(4, 3, 7, False)
E5M2 = Fmt(5, 2, 15, True)
FMT = {"e4m3": E4M3, "e5m2": E5M2}
MAXV = {"e4m3": 448, "e5m2": 57344}
EMAX = {"e4m3": 8, "e5m2": 15}


@dataclass(frozen=True)
class Val:
    """``(-1)^sign · m · 2^e``, or a special (kind 'nan' / 'inf')."""

    kind: str  # "fin" | "inf" | "nan"
    sign: int = 0
    m: int = 0
    e: int = 0

    def frac(self) -> Fraction:
        assert self.kind == "fin"
        v = Fraction(self.m) * (Fraction(2) ** self.e)
        return -v if self.sign else v

    def mag(self) -> Fraction | float:
        if self.kind == "nan":
            return float("nan")
        if self.kind == "inf":
            return float("inf")
        return abs(self.frac())


def decode(bits: int, fmt: Fmt) -> Val:
    sign = bits >> (fmt.width - 1)
    exp = (bits >> fmt.mbits) & ((1 << fmt.ebits) - 1)
    mant = bits & ((1 << fmt.mbits) - 1)
    all_ones = (1 << fmt.ebits) - 1
    if fmt.ieee and exp == all_ones:
        return Val("nan" if mant else "inf", sign)
    if not fmt.ieee and exp == all_ones and mant == (1 << fmt.mbits) - 1:
        return Val("nan", sign)
    if exp == 0:
        return Val("fin", sign, mant, 1 - fmt.bias - fmt.mbits)
    return Val("fin", sign, mant | (1 << fmt.mbits), exp - fmt.bias - fmt.mbits)


def encode(v: Val, fmt: Fmt, saturate: bool) -> int:
    """Round ``v`` to ``fmt``: RNE; overflow → max (saturate) or Inf (IEEE); NaN keeps its sign."""
    sbit = v.sign << (fmt.width - 1)
    if v.kind == "nan":
        return fmt.nan_bits(v.sign)
    if v.kind == "inf":
        return sbit | (fmt.max_bits() if saturate or not fmt.ieee else fmt.inf_bits())
    m, e = v.m, v.e
    if m == 0:
        return sbit
    top = m.bit_length() - 1 + e  # value in [2^top, 2^(top+1))
    emin = 1 - fmt.bias
    q = max(top, emin) - fmt.mbits  # exponent of one unit in the last place
    if e >= q:
        n = m << (e - q)
    else:
        shift = q - e
        n, rem = m >> shift, m & ((1 << shift) - 1)
        half = 1 << (shift - 1)
        if rem > half or (rem == half and n & 1):
            n += 1
    if n >= (1 << (fmt.mbits + 1)):  # carried into the next binade
        n >>= 1
        q += 1
    if n >= (1 << fmt.mbits):
        biased, mant = q + fmt.mbits + fmt.bias, n - (1 << fmt.mbits)
    else:
        biased, mant = 0, n
    if biased > fmt.top_exp or (biased == fmt.top_exp and mant > fmt.top_mant):
        if saturate or not fmt.ieee:
            return sbit | fmt.max_bits()
        return sbit | fmt.inf_bits()
    return sbit | (biased << fmt.mbits) | mant


def f32_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def bits_f32(b: int) -> float:
    return struct.unpack("<f", struct.pack("<I", b & 0xFFFFFFFF))[0]


def from_float(x: float) -> Val:
    """Exact Val of a Python float (any double, so fp32/bf16 values are exact)."""
    if x != x:
        return Val("nan", 1 if math.copysign(1.0, x) < 0 else 0)
    if x in (float("inf"), float("-inf")):
        return Val("inf", int(x < 0))
    sign = 1 if (x < 0 or (x == 0 and struct.pack(">d", x)[0] & 0x80)) else 0
    num, den = abs(x).as_integer_ratio()
    return Val("fin", sign, num, -(den.bit_length() - 1))  # den is a power of two


def mul_pow2(v: Val, k: int) -> Val:
    return Val(v.kind, v.sign, v.m, v.e + k) if v.kind == "fin" else v


def mul(a: Val, b: Val) -> Val:
    if a.kind == "nan" or b.kind == "nan":
        return Val("nan")
    if a.kind == "inf" or b.kind == "inf":
        zero = (a.kind == "fin" and a.m == 0) or (b.kind == "fin" and b.m == 0)
        return Val("nan") if zero else Val("inf", a.sign ^ b.sign)
    return Val("fin", a.sign ^ b.sign, a.m * b.m, a.e + b.e)


def round_f32(v: Val) -> Val:
    """Round to fp32 (what an fp32 ALU would produce), keeping the result as a Val."""
    return decode(encode(v, F32, saturate=False), F32)


def div_f32(a: Val, b: Val) -> Val:
    """Correctly rounded fp32 quotient of two finite values (b ≠ 0), by integer long division."""
    assert a.kind == b.kind == "fin" and b.m
    if a.m == 0:
        return Val("fin", a.sign ^ b.sign, 0, 0)
    # scale the numerator so the integer quotient has ≥ 60 bits; the remainder decides the sticky bit
    k = 60 + b.m.bit_length() - a.m.bit_length()
    qt, rem = divmod(a.m << max(k, 0), b.m)
    qt = (qt << 1) | (1 if rem else 0)  # sticky bit below the integer quotient
    return round_f32(Val("fin", a.sign ^ b.sign, qt, a.e - b.e - max(k, 0) - 1))


def is_nan(v: Val) -> bool:
    return v.kind == "nan"


def amax(vals: list[Val], nan: str) -> Val:
    """max |v| as in TE (fmaxf: NaN skipped) or torch.amax (NaN propagates)."""
    best = Val("fin", 0, 0, 0)
    for v in vals:
        if v.kind == "nan":
            if nan == "propagate":
                return Val("nan")
            continue
        if v.kind == "inf":
            best = Val("inf")
        elif best.kind != "inf" and abs(v.frac()) > best.frac():
            best = Val("fin", 0, v.m, v.e)
    return best


# ---------------------------------------------------------------- MX (OCP MX v1.0 / TE)


def _floor_log2(v: Val) -> int:
    return v.m.bit_length() - 1 + v.e


def e8m0_byte(a: Val, elem: str, rule: str) -> int:
    """The E8M0 byte for a block amax under ``rule`` (TE RCEIL; OCP FLOOR; torchao CEIL/EVEN)."""
    if a.kind == "nan":
        return 0xFF
    if rule == "rceil":
        if a.kind == "inf":
            return 0xFE
        rcp = round_f32(from_float(1.0 / MAXV[elem]))  # TE: double 1.0/max, then float
        d = encode(mul(a, rcp), F32, saturate=False)
        exp, mant = d >> 23, d & 0x7FFFFF
        if d == 0:
            return 0
        if exp == 0:  # subnormal d
            return 0 if mant <= 0x400000 else 1
        return exp + (1 if mant and exp != 0xFE else 0)
    if a.kind == "inf":
        unbiased = 128  # Inf's exponent field (255) minus 127
    elif a.m == 0:
        unbiased = -127
    else:
        fl = _floor_log2(a)
        if rule == "floor":
            unbiased = fl
        elif rule == "ceil":
            exact_pow2 = a.m & (a.m - 1) == 0
            unbiased = fl if exact_pow2 else fl + 1
        elif rule == "even":  # round amax half-up to the element's mantissa width, then floor
            mb = FMT[elem].mbits
            quantum = fl - mb
            n = a.frac() / Fraction(2) ** quantum
            r = int(n + Fraction(1, 2))
            unbiased = (r.bit_length() - 1) + quantum
        else:
            raise ValueError(rule)
        unbiased = max(unbiased, -127)  # fp32 exponent bits cannot read below -127
    return min(max(unbiased - EMAX[elem], -127), 128) + 127


def mx_element(x: Val, byte: int, elem: str) -> int:
    """sat_rne(fp32(x · 2^(127 − byte))) as an FP8 bit pattern."""
    if byte == 0xFF:  # NaN scale: the whole block is NaN (the sign of a NaN carries no meaning)
        return FMT[elem].nan_bits()
    mult = 127 - byte  # byte 0xFE → 2^-127, byte 0 → 2^127
    v = round_f32(mul_pow2(x, mult))
    return encode(v, FMT[elem], saturate=True)


def mx_block(xs: list[float], elem: str, rule: str, nan: str) -> tuple[int, list[int]]:
    vals = [from_float(x) for x in xs]
    byte = e8m0_byte(amax(vals, nan), elem, rule)
    return byte, [mx_element(v, byte, elem) for v in vals]


# ---------------------------------------------------------------- other grids


def bf16_bits(x: float) -> int:
    return encode(from_float(x), BF16, saturate=False)


def block_weight_tile(xs: list[float], ue8m0: bool) -> tuple[float, list[int]]:
    """DeepGEMM per_block_cast_to_fp8 for one tile: amax.clamp(1e-4), sf=amax/448, x*(1/sf)."""
    a = amax([from_float(x) for x in xs], "propagate")
    if a.kind == "nan":
        return float("nan"), [E4M3.nan_bits() for _ in xs]
    floor = round_f32(from_float(1e-4))
    if a.kind == "fin" and a.frac() < floor.frac():
        a = floor
    sf = Val("inf") if a.kind == "inf" else div_f32(a, from_float(448.0))
    if ue8m0:  # exponent field (255 for Inf) rounded up, clamped to [1, 254]
        b = encode(sf, F32, False)
        exp = (b >> 23) + (1 if b & 0x7FFFFF and sf.kind == "fin" else 0)
        sf = decode(min(max(exp, 1), 254) << 23, F32)
    inv = Val("fin", 0, 0, 0) if sf.kind == "inf" else div_f32(from_float(1.0), sf)
    codes = [encode(round_f32(mul(from_float(x), inv)), E4M3, saturate=True) for x in xs]
    return (float("inf") if sf.kind == "inf" else float(sf.frac())), codes


def block_act_group(xs: list[float], ue8m0: bool) -> tuple[float, list[int]]:
    """vLLM per_token_group_quant_fp8 for one group: s=max(amax,1e-10)/448, q=sat(x/s)."""
    a = amax([from_float(x) for x in xs], "ignore")
    eps = round_f32(from_float(1e-10))
    if a.kind == "fin" and a.frac() < eps.frac():
        a = eps
    if a.kind == "inf":
        s = Val("inf")
    else:
        s = div_f32(a, from_float(448.0))
    if ue8m0 and s.kind == "fin":
        if s.frac() < eps.frac():
            s = eps
        b = encode(s, F32, False)
        exp = (b >> 23) + (1 if b & 0x7FFFFF else 0)
        s = decode(exp << 23, F32)
    codes = []
    for x in xs:
        v = from_float(x)
        if v.kind == "nan":
            codes.append(E4M3.nan_bits(v.sign))
        elif s.kind == "inf":
            codes.append(E4M3.nan_bits() if v.kind == "inf" else encode(Val("fin", v.sign, 0, 0), E4M3, True))
        elif v.kind == "inf":
            codes.append(encode(v, E4M3, True))
        else:
            codes.append(encode(div_f32(v, s), E4M3, saturate=True))
    return float(s.frac()) if s.kind == "fin" else float("inf"), codes


def tensor_current(xs: list[float], elem: str, pow2: bool) -> tuple[float, list[int]]:
    """TE current scaling: scale = max/amax (1 for 0/Inf amax; FLT_MAX for an Inf quotient)."""
    a = amax([from_float(x) for x in xs], "ignore")
    if a.kind != "fin" or a.m == 0:
        scale = from_float(1.0)
    else:
        q = encode(div_f32(from_float(float(MAXV[elem])), a), F32, False)
        if q == F32.inf_bits():
            q = F32.max_bits()
        scale = decode(q, F32)
    if pow2:
        scale = decode(encode(scale, F32, False) & 0xFF800000, F32)
    codes = [encode(round_f32(mul(from_float(x), scale)), FMT[elem], saturate=True) for x in xs]
    inv = div_f32(from_float(1.0), scale)
    return float(inv.frac()), codes


def kv_write(xs: list[float], elem: str, writer: str, scale: float, in_bf16: bool) -> list[int]:
    """vLLM: sat_rne(fp32(x)/s). SGLang: x/s rounded to the input dtype, then torch's cast."""
    s = from_float(scale)
    out = []
    for x in xs:
        v = from_float(x)
        if v.kind == "fin":
            q = div_f32(v, s)
            if writer == "sglang" and in_bf16:
                q = decode(encode(q, BF16, saturate=False), BF16)
        else:
            q = v
        if writer == "vllm":
            out.append(encode(q, FMT[elem], saturate=True))
        else:  # torch 2.13's cast: e4m3fn saturates, e5m2 overflows to Inf
            out.append(encode(q, FMT[elem], saturate=(elem == "e4m3")))
    return out


def swizzle_offset(r: int, c: int, cols: int) -> int:
    """cuBLAS 128x4 scale layout offset of scale (row r, column c) in a matrix with ``cols`` columns."""
    col_tiles = -(-cols // 4)
    return ((r // 128) * col_tiles + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4
