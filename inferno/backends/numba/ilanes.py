"""Integer vectors for Numba kernels: the int8 dot products of quantized weights with quantized
activations (qdot.py), as LLVM's `<32 x i8>`, `<16 x i16>` and `<8 x i32>` (one 256-bit
register each), and `<8 x float>` for their float sums; and their 512-bit twins `<64 x i8>`,
`<32 x i16>` and `<16 x i32>` (qgemm's panels of sixteen rows). The arithmetic takes either
width and answers in the width it was given. Where the machine has AVX-512 (VNNI for
`dpbusd`) a 512-bit operation is one zmm instruction; elsewhere it is the 256-bit one on each
half, so code written in 512 bits is correct, and about as fast as its 256-bit spelling, on
every machine.

The two multiplies x86 does on bytes are chosen when the kernels compile, from the features of
the machine Numba compiles for (NUMBA_CPU_NAME / NUMBA_CPU_FEATURES, else the host's; Numba's
cache is keyed on them, so code chosen here never runs on a machine without them):
- `maddubs`: unsigned bytes x signed bytes, adjacent pairs summed to int16 (AVX2's vpmaddubsw);
- `dpbusd`: the same with adjacent quads summed into int32 lanes of an accumulator (VNNI's
  vpdpbusd with AVX512-VNNI + VL or AVX-VNNI; else vpmaddubsw, vpmaddwd by ones and an add).
Without AVX2 (another ISA, or x86 without it) each is written as plain LLVM vector arithmetic
(widen, multiply, add even and odd lanes), which LLVM lowers for any target: correct
everywhere, fast only where the backend finds the same instructions. The backends use these
kernels by default only where AVX2 is there (`fast_int_dot`).

Byte loads read in place with no alignment assumed and no bounds checks (see lanes.py).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

from inferno.backends.numba.lanes import MXFP4_VALUES, _VF, _address, _exact_fma, e8m0_bits, f32x16, fp4_values, kscale_bytes

_I1, _I8, _I16, _I32 = ir.IntType(1), ir.IntType(8), ir.IntType(16), ir.IntType(32)
_F32 = ir.FloatType()
_B = ir.VectorType(_I8, 32)
_W = ir.VectorType(_I16, 16)
_D = ir.VectorType(_I32, 8)
_F8 = ir.VectorType(_F32, 8)
_W32 = ir.VectorType(_I32, 16)
_ZB = ir.VectorType(_I8, 64)
_ZW = ir.VectorType(_I16, 32)
_Z = _W32


class I8x32(types.Type):
    llty = _B

    def __init__(self):
        super().__init__(name="i8x32")


class I16x16(types.Type):
    llty = _W

    def __init__(self):
        super().__init__(name="i16x16")


class I32x8(types.Type):
    llty = _D

    def __init__(self):
        super().__init__(name="i32x8")


class F32x8(types.Type):
    llty = _F8

    def __init__(self):
        super().__init__(name="f32x8")


class I8x64(types.Type):
    llty = _ZB

    def __init__(self):
        super().__init__(name="i8x64")


class I16x32(types.Type):
    llty = _ZW

    def __init__(self):
        super().__init__(name="i16x32")


class I32x16(types.Type):
    llty = _Z

    def __init__(self):
        super().__init__(name="i32x16")


i8x32, i16x16, i32x8, f32x8 = I8x32(), I16x16(), I32x8(), F32x8()
i8x64, i16x32, i32x16 = I8x64(), I16x32(), I32x16()
# Each width's bytes, int16 and int32 vectors: the arithmetic below is typed by its arguments.
_NARROW, _WIDE = (i8x32, i16x16, i32x8), (i8x64, i16x32, i32x16)


class _VecModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, fe_type.llty)


for _cls in (I8x32, I16x16, I32x8, F32x8, I8x64, I16x32, I32x16):
    register_model(_cls)(_VecModel)


def target_features() -> set[str]:
    """The features Numba compiles for: NUMBA_CPU_FEATURES if set, else the host's."""
    from numba.core import config
    from numba.core.codegen import get_host_cpu_features

    features = config.CPU_FEATURES if config.CPU_FEATURES is not None else get_host_cpu_features()
    return {f[1:] for f in features.split(",") if f.startswith("+")}


def fast_int_dot() -> bool:
    """Whether the byte multiplies compile to x86's (see the module docstring)."""
    return "avx2" in target_features()


def _vnni() -> bool:
    f = target_features()
    return ("avx512vnni" in f and "avx512vl" in f) or "avxvnni" in f


def zmm_int_dot() -> bool:
    """Whether `dpbusd` on 512-bit vectors is one zmm vpdpbusd (AVX-512 VNNI); elsewhere it is
    the 256-bit `dpbusd` on each half."""
    f = target_features()
    return fast_int_dot() and "avx512vnni" in f and "avx512bw" in f


def zmm_registers() -> bool:
    """Whether the machine has AVX-512's 32 vector registers (AVX2 has 16): how many rows'
    sums a kernel can keep in registers."""
    return "avx512f" in target_features()


def _zmm_bytes() -> bool:
    """Whether 512-bit vpmaddubsw and vpmaddwd exist (AVX-512 BW)."""
    return fast_int_dot() and "avx512bw" in target_features()


def _halves(builder, v):
    """The low and high halves of a vector."""
    n = v.type.count // 2
    pick = lambda first: ir.Constant(ir.VectorType(_I32, n), list(range(first, first + n)))  # noqa: E731
    return builder.shuffle_vector(v, v, pick(0)), builder.shuffle_vector(v, v, pick(n))


def _join(builder, lo, hi):
    return builder.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(_I32, 2 * lo.type.count),
                                                      list(range(2 * lo.type.count))))


def _by_halves(builder, fn, *args):
    """fn (a 256-bit operation) on the low halves and on the high halves of 512-bit args, joined."""
    lo, hi = zip(*(_halves(builder, a) for a in args))
    return _join(builder, fn(builder, *lo), fn(builder, *hi))


def _width(*args):
    """(bytes, int16, int32) types of the width all of args share, else None."""
    for family in (_NARROW, _WIDE):
        if all(a in family for a in args):
            return family
    return None


def _const(vty, value):
    return ir.Constant(vty, [value] * vty.count)


def _splat(builder, scalar, vty):
    undef = ir.Constant(vty, ir.Undefined)
    v = builder.insert_element(undef, scalar, ir.Constant(_I32, 0))
    return builder.shuffle_vector(v, undef, ir.Constant(ir.VectorType(_I32, vty.count), [0] * vty.count))


def _scalar_splat(name, result, scalar, vec, doc):
    """An intrinsic `name`(x): x cast to `scalar` (a Numba type) in every lane of `vec` (its LLVM
    type), typed `result`."""
    def splat(typingctx, x):
        def codegen(context, builder, sig, args):
            return _splat(builder, context.cast(builder, args[0], sig.args[0], scalar), vec)
        return result(x), codegen
    splat.__name__ = splat.__qualname__ = name
    splat.__doc__ = doc
    return intrinsic(splat)


zisplat = _scalar_splat("zisplat", i32x16, types.int32, _Z, "The integer x in all 16 int32 lanes.")
isplat8 = _scalar_splat("isplat8", i32x8, types.int32, _D, "The integer x in all 8 int32 lanes.")
fsplat8 = _scalar_splat("fsplat8", f32x8, types.float32, _F8, "x in all 8 float32 lanes.")


def _x86(builder, name, ret, args):
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, [a.type for a in args]), name)
    return builder.call(fn, args)


def _pairs(builder, v, wide):
    """Adjacent lanes of v added: lane i of the result is v[2i] + v[2i + 1], in type `wide`."""
    n = v.type.count // 2
    even = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, n), list(range(0, 2 * n, 2))))
    odd = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, n), list(range(1, 2 * n, 2))))
    return builder.add(even, odd) if even.type == wide else builder.add(builder.sext(even, wide), builder.sext(odd, wide))


def _maddubs(builder, u, s):
    if fast_int_dot():
        return _x86(builder, "llvm.x86.avx2.pmadd.ub.sw", _W, [u, s])
    prod = builder.mul(builder.zext(u, ir.VectorType(_I16, 32)), builder.sext(s, ir.VectorType(_I16, 32)))
    n = 16
    even = builder.shuffle_vector(prod, prod, ir.Constant(ir.VectorType(_I32, n), list(range(0, 32, 2))))
    odd = builder.shuffle_vector(prod, prod, ir.Constant(ir.VectorType(_I32, n), list(range(1, 32, 2))))
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_W, [_W, _W]), "llvm.sadd.sat.v16i16")
    return builder.call(fn, [even, odd])


def _maddwd(builder, a, b):
    if fast_int_dot():
        return _x86(builder, "llvm.x86.avx2.pmadd.wd", _D, [a, b])
    prod = builder.mul(builder.sext(a, _W32), builder.sext(b, _W32))
    return _pairs(builder, prod, _D)


def _dpbusd(builder, acc, u, s):
    if fast_int_dot() and _vnni():
        return _x86(builder, "llvm.x86.avx512.vpdpbusd.256", _D,
                    [acc, builder.bitcast(u, _D), builder.bitcast(s, _D)])
    return builder.add(acc, _maddwd(builder, _maddubs(builder, u, s), _const(_W, 1)))


def _zmaddubs(builder, u, s):
    if _zmm_bytes():
        return _x86(builder, "llvm.x86.avx512.pmaddubs.w.512", _ZW, [u, s])
    return _by_halves(builder, _maddubs, u, s)


def _zmaddwd(builder, a, b):
    if _zmm_bytes():
        return _x86(builder, "llvm.x86.avx512.pmaddw.d.512", _Z, [a, b])
    return _by_halves(builder, _maddwd, a, b)


def _zdpbusd(builder, acc, u, s):
    if zmm_int_dot():
        return _x86(builder, "llvm.x86.avx512.vpdpbusd.512", _Z,
                    [acc, builder.bitcast(u, _Z), builder.bitcast(s, _Z)])
    return _by_halves(builder, _dpbusd, acc, u, s)


def _int(context, builder, value, ty, to=types.int32):
    return context.cast(builder, value, ty, to)


# -- bytes ---------------------------------------------------------------------------------------------
def _vector_zero(name, result, vec, zero):
    """An intrinsic `name()`: the vector `result` (of LLVM type `vec`) with every lane `zero`."""
    def make(typingctx):
        return result(), lambda context, builder, sig, args: _const(vec, zero)
    make.__name__ = make.__qualname__ = name
    return intrinsic(make)


def _vector_load(name, result, elem, count, align, doc):
    """An intrinsic `name(f, o)`: the `count` elements f[o:o + count] as the vector `result`."""
    def load(typingctx, f, o):
        def codegen(context, builder, sig, args):
            return builder.load(_address(context, builder, sig.args[0], args[0], args[1], elem, count), align=align)
        return result(f, types.intp), codegen
    load.__name__ = load.__qualname__ = name
    load.__doc__ = doc
    return intrinsic(load)


def _vector_store(name, vtype, elem, count, align, doc):
    """An intrinsic `name(f, o, v)`: f[o:o + count] = the vector v (of type `vtype`)."""
    def store(typingctx, f, o, v):
        def codegen(context, builder, sig, args):
            builder.store(args[2], _address(context, builder, sig.args[0], args[0], args[1], elem, count), align=align)
            return context.get_dummy_value()
        return types.void(f, types.intp, vtype), codegen
    store.__name__ = store.__qualname__ = name
    store.__doc__ = doc
    return intrinsic(store)


bload = _vector_load("bload", i8x32, _I8, 32, 1, "The 32 bytes f[o:o + 32] of a uint8 or int8 array.")
iload = _vector_load("iload", i32x8, _I32, 8, 4, "The 8 int32 f[o:o + 8] of an int32 array.")
zbload = _vector_load("zbload", i8x64, _I8, 64, 1, "The 64 bytes f[o:o + 64] of a uint8 or int8 array.")
ziload = _vector_load("ziload", i32x16, _I32, 16, 4, "The 16 int32 f[o:o + 16] of an int32 array.")


@intrinsic
def bbits(typingctx, v, shift, mask):
    """(v >> shift) & mask, byte by byte (logical shift)."""
    def codegen(context, builder, sig, args):
        s, m = (builder.trunc(_int(context, builder, args[i], sig.args[i]), _I8) for i in (1, 2))
        return builder.and_(builder.lshr(args[0], _splat(builder, s, _B)), _splat(builder, m, _B))
    return i8x32(i8x32, shift, mask), codegen


@intrinsic
def bhigh(typingctx, lo, hi, shift, mask):
    """lo | (((hi >> shift) & mask) << 4), byte by byte: a Q6_K quant from its nibble and its
    two high bits (mask 3), a Q5_K one from its nibble and its fifth bit (mask 1)."""
    def codegen(context, builder, sig, args):
        s, m = (builder.trunc(_int(context, builder, args[i], sig.args[i]), _I8) for i in (2, 3))
        h = builder.and_(builder.lshr(args[1], _splat(builder, s, _B)), _splat(builder, m, _B))
        return builder.or_(args[0], builder.shl(h, _const(_B, 4)))
    return i8x32(i8x32, i8x32, shift, mask), codegen


# -- products ------------------------------------------------------------------------------------------
@intrinsic
def maddubs(typingctx, u, s):
    """u[2i] s[2i] + u[2i + 1] s[2i + 1] as int16 (u unsigned, s signed bytes; saturating,
    which the callers' ranges never reach): 16 lanes from 32 bytes, 32 from 64."""
    family = _width(u, s)
    if family is None or u != family[0] or s != family[0]:
        return None

    def codegen(context, builder, sig, args):
        return (_maddubs if family is _NARROW else _zmaddubs)(builder, args[0], args[1])
    return family[1](u, s), codegen


@intrinsic
def maddwd(typingctx, a, b):
    """a[2i] b[2i] + a[2i + 1] b[2i + 1] as int32 (8 lanes, or 16 from 512-bit a and b)."""
    family = _width(a, b)
    if family is None or a != family[1] or b != family[1]:
        return None

    def codegen(context, builder, sig, args):
        return (_maddwd if family is _NARROW else _zmaddwd)(builder, args[0], args[1])
    return family[2](a, b), codegen


@intrinsic
def dpbusd(typingctx, acc, u, s):
    """acc + the sums of adjacent quads of u x s (u unsigned, s signed bytes), as int32 lanes:
    8 of them, or 16 from 512-bit vectors."""
    family = _width(acc, u, s)
    if family is None or acc != family[2] or u != family[0] or s != family[0]:
        return None

    def codegen(context, builder, sig, args):
        return (_dpbusd if family is _NARROW else _zdpbusd)(builder, *args)
    return acc(acc, u, s), codegen


def _dpwssd(builder, acc, a, b):
    if fast_int_dot() and _vnni():
        return _x86(builder, "llvm.x86.avx512.vpdpwssd.256", _D,
                    [acc, builder.bitcast(a, _D), builder.bitcast(b, _D)])
    return builder.add(acc, _maddwd(builder, a, b))


def _zdpwssd(builder, acc, a, b):
    if zmm_int_dot():
        return _x86(builder, "llvm.x86.avx512.vpdpwssd.512", _Z,
                    [acc, builder.bitcast(a, _Z), builder.bitcast(b, _Z)])
    return _by_halves(builder, _dpwssd, acc, a, b)


@intrinsic
def dpwssd(typingctx, acc, a, b):
    """acc + the sums of adjacent pairs of a x b (signed int16), as int32 lanes (8, or 16 from
    512-bit vectors): VNNI's vpdpwssd where `dpbusd` has vpdpbusd, else vpmaddwd and an add
    (lgemm's int16 panels)."""
    family = _width(acc, a, b)
    if family is None or acc != family[2] or a != family[1] or b != family[1]:
        return None

    def codegen(context, builder, sig, args):
        return (_dpwssd if family is _NARROW else _zdpwssd)(builder, *args)
    return acc(acc, a, b), codegen


@intrinsic
def iadd(typingctx, a, b):
    """a + b in int32 lanes (8 or 16)."""
    if a != b or a not in (i32x8, i32x16):
        return None

    def codegen(context, builder, sig, args):
        return builder.add(args[0], args[1])
    return a(a, b), codegen


izero = _vector_zero("izero", i32x8, _D, 0)


zizero = _vector_zero("zizero", i32x16, _Z, 0)


def _vector_splat(name, result, vec, words, align, doc):
    """An intrinsic `name(f, o)`: the 4 bytes at f[o] (one int32 word, `align`ed as f's
    elements) in each int32 word of the LLVM vector type `words`, as `result` (LLVM `vec`)."""
    def splat(typingctx, f, o):
        def codegen(context, builder, sig, args):
            w = builder.load(_address(context, builder, sig.args[0], args[0], args[1], _I32, 1), align=align)
            return builder.bitcast(_splat(builder, w, words), vec)
        return result(f, types.intp), codegen
    splat.__name__ = splat.__qualname__ = name
    splat.__doc__ = doc
    return intrinsic(splat)


bsplat4 = _vector_splat("bsplat4", i8x32, _B, _D, 1, "The 4 bytes f[o:o + 4] in each of the 8 quads: "
                        "one activation's four values against eight weight rows' (kpanels' stored panels).")
zbsplat4 = _vector_splat("zbsplat4", i8x64, _ZB, _Z, 1,
                         "The 4 bytes f[o:o + 4] in each of the 16 quads (qgemm's panels of sixteen rows).")
zhsplat2 = _vector_splat("zhsplat2", i16x32, _ZW, _Z, 2,
                         "The 2 int16 f[o:o + 2] in each of the 16 pairs (lgemm's panels of sixteen rows).")


@intrinsic
def imul(typingctx, a, b):
    """a * b, lane by lane, in int32 (8 or 16 lanes; the callers' products stay far below 2^31)."""
    if a != b or a not in (i32x8, i32x16):
        return None

    def codegen(context, builder, sig, args):
        return builder.mul(args[0], args[1])
    return a(a, b), codegen


def _transpose8(builder, rows):
    """The 8x8 transpose of 8 <8 x i32> (unpack 32-bit, unpack 64-bit, swap 128-bit halves: the
    24 shuffles of the usual AVX sequence)."""
    def shuffle(a, b, mask):
        return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(_I32, 8), mask))
    t = []
    for k in range(0, 8, 2):
        t += [shuffle(rows[k], rows[k + 1], [0, 8, 1, 9, 4, 12, 5, 13]),
              shuffle(rows[k], rows[k + 1], [2, 10, 3, 11, 6, 14, 7, 15])]
    u = []
    for k in (0, 4):  # t[k], t[k + 1] pair with t[k + 2], t[k + 3]
        u += [shuffle(t[k], t[k + 2], [0, 1, 8, 9, 4, 5, 12, 13]), shuffle(t[k], t[k + 2], [2, 3, 10, 11, 6, 7, 14, 15]),
              shuffle(t[k + 1], t[k + 3], [0, 1, 8, 9, 4, 5, 12, 13]), shuffle(t[k + 1], t[k + 3], [2, 3, 10, 11, 6, 7, 14, 15])]
    lo, hi = [0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]
    return [shuffle(u[c], u[c + 4], lo) for c in range(4)] + [shuffle(u[c], u[c + 4], hi) for c in range(4)]


@intrinsic
def bstore_columns(typingctx, f, o, stride, v0, v1, v2, v3, v4, v5, v6, v7):
    """f[o + stride t: o + stride t + 32] = the 4-byte words t of v0..v7, in that order, for t in
    0..7: eight rows' runs of 32 bytes, interleaved by fours (qgemm's panels, stride 64: their
    two halves' steps side by side; kpanels' stored ones, stride 32), or 16 int16 each,
    interleaved by pairs (lgemm's panels, stride 64), f a byte array."""
    def codegen(context, builder, sig, args):
        cols = _transpose8(builder, [builder.bitcast(v, _D) for v in args[3:]])
        base = context.make_array(sig.args[0])(context, builder, args[0]).data
        o = context.cast(builder, args[1], sig.args[1], types.intp)
        stride = context.cast(builder, args[2], sig.args[2], types.intp)
        for t, col in enumerate(cols):
            at = builder.add(o, builder.mul(stride, ir.Constant(o.type, t)))
            p = builder.gep(base, [at], inbounds=True)
            builder.store(col, builder.bitcast(p, _D.as_pointer()), align=1)
        return context.get_dummy_value()
    vty = v0 if v0 in (i8x32, i16x16) else None
    if vty is None or any(v != vty for v in (v1, v2, v3, v4, v5, v6, v7)):
        return None
    return types.void(f, o, stride, *([vty] * 8)), codegen


# -- int16 sums and scales -----------------------------------------------------------------------------
wzero = _vector_zero("wzero", i16x16, _W, 0)


zwzero = _vector_zero("zwzero", i16x32, _ZW, 0)


@intrinsic
def wadd(typingctx, a, b):
    """a + b in int16 lanes (16 or 32), wrapping (the callers keep their sums within int16)."""
    if a != b or a not in (i16x16, i16x32):
        return None

    def codegen(context, builder, sig, args):
        return builder.add(args[0], args[1])
    return a(a, b), codegen


@intrinsic
def wsub_const(typingctx, a, c):
    """a - c in int16 lanes, c a literal (lgemm: Q4_0's and Q5_0's q less their offset)."""
    if not isinstance(c, types.IntegerLiteral):
        return None
    value = c.literal_value

    if a not in (i16x16, i16x32):
        return None

    def codegen(context, builder, sig, args):
        return builder.sub(args[0], _const(args[0].type, value))
    return a(a, c), codegen


@intrinsic
def wdup(typingctx, v):
    """The low 16 bits of int32 lane i in int16 lanes 2i and 2i + 1: a panel's per-row scales
    (8 or 16) as maddwd's second operand against maddubs' pairs (qgemm)."""
    family = _width(v)
    if family is None or v != family[2]:
        return None
    n = 2 * family[2].llty.count

    def codegen(context, builder, sig, args):
        w = builder.bitcast(args[0], family[1].llty)
        return builder.shuffle_vector(w, w, ir.Constant(ir.VectorType(_I32, n), [2 * (i // 2) for i in range(n)]))
    return family[1](v), codegen


@intrinsic
def wbytes(typingctx, f, o, signed):
    """The 16 bytes f[o:o + 16] as int16 (sign-extended if the literal `signed`, else zero)."""
    if not isinstance(signed, types.BooleanLiteral):
        return None
    ext = "sext" if signed.literal_value else "zext"

    def codegen(context, builder, sig, args):
        b = builder.load(_address(context, builder, sig.args[0], args[0], args[1], _I8, 16), align=1)
        return getattr(builder, ext)(b, _W)
    return i16x16(f, types.intp, signed), codegen


hload = _vector_load("hload", i16x16, _I16, 16, 2, "The 16 int16 f[o:o + 16] of an int16 array.")
zhload = _vector_load("zhload", i16x32, _I16, 32, 2, "The 32 int16 f[o:o + 32] of an int16 array.")


def _nibbles(high, fp4: bool):
    """The codegen of 16 bytes' low nibbles (high ones if the literal `high`) as 16 int16 lanes:
    the nibbles themselves, or (`fp4`) MXFP4's values for them (lanes.MXFP4_VALUES[q])."""
    if not isinstance(high, types.BooleanLiteral):
        return None
    hi = high.literal_value

    def codegen(context, builder, sig, args):
        half = ir.VectorType(_I8, 16)
        b = builder.load(_address(context, builder, sig.args[0], args[0], args[1], _I8, 16), align=1)
        b = builder.lshr(b, _const(half, 4)) if hi else builder.and_(b, _const(half, 15))
        return builder.sext(fp4_values(builder, b), _W) if fp4 else builder.zext(b, _W)
    return codegen


@intrinsic
def wnib(typingctx, f, o, high):
    """The 16 bytes f[o:o + 16]'s low nibbles (high nibbles if the literal `high`) as int16: half
    of a legacy 4-bit block's weights, in order (Q4_0, Q4_1: weight i low, i + 16 high)."""
    codegen = _nibbles(high, fp4=False)
    return None if codegen is None else (i16x16(f, types.intp, high), codegen)


@intrinsic
def wfp4(typingctx, f, o, high):
    """wnib's nibbles of an MXFP4 block as its weights' integers, lanes.MXFP4_VALUES[q] (-12..12)."""
    codegen = _nibbles(high, fp4=True)
    return None if codegen is None else (i16x16(f, types.intp, high), codegen)


# -- a 4-bit block's weights in dealt order (ldot's one-row matvec) -------------------------------------
# Widening bytes to int16 lanes (vpmovzxbw, vpmovsxbw) crosses a register's 128-bit quarters, and
# a Q4_0, Q4_1 or MXFP4 block took four such widenings and four 256-bit products. Read as words,
# a block's 16 bytes already hold its 32 nibbles, four to a word: broadcast to the four quarters
# of a 512-bit register, one shift (by 0, 8, 4 and 12 bits, a quarter each) and one mask give all
# 32 weights as int16 lanes, no shuffle, for one product. They come in the order DEALT (lane k
# holds weight DEALT[k]); `hdeal` puts a block's activations in the same order once a call, and a
# dot product does not mind the order of its terms.
DEALT = (*range(0, 16, 2), *range(1, 16, 2), *range(16, 32, 2), *range(17, 32, 2))
_DEALT_SHIFTS = (0,) * 8 + (8,) * 8 + (4,) * 8 + (12,) * 8
# MXFP4's values with 12 added (0..24): a table lookup's int16 lanes are its byte zero-extended,
# so the values must be unsigned; ldot takes the 12 off the block's sum
MXFP4_PLUS12 = tuple(v + 12 for v in MXFP4_VALUES)


def _word_lookup(builder, n, table):
    """table[n] for 32 int16 lanes n (0..15), zero-extended from its byte (table: 16 bytes,
    0..255): one pshufb on AVX-512 BW (each index's high byte has bit 7 set, which pshufb writes
    0), two on AVX2, elsewhere a select per entry (correct, not fast)."""
    if "avx512bw" in target_features() or "avx2" in target_features():
        idx = builder.bitcast(builder.or_(n, _const(_ZW, 0x8000)), _ZB)
        if "avx512bw" in target_features():
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_ZB, [_ZB, _ZB]), "llvm.x86.avx512.pshuf.b.512")
            return builder.bitcast(builder.call(fn, [ir.Constant(_ZB, list(table) * 4), idx]), _ZW)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_B, [_B, _B]), "llvm.x86.avx2.pshuf.b")
        lo, hi = _halves(builder, idx)
        t = ir.Constant(_B, list(table) * 2)
        return builder.bitcast(_join(builder, builder.call(fn, [t, lo]), builder.call(fn, [t, hi])), _ZW)
    out = _const(_ZW, 0)
    for q, v in enumerate(table):
        out = builder.select(builder.icmp_unsigned("==", n, _const(_ZW, q)), _const(_ZW, v), out)
    return out


def _dealt_codegen(fp4: bool):
    def codegen(context, builder, sig, args):
        b = builder.load(_address(context, builder, sig.args[0], args[0], args[1], _I8, 16), align=1)
        words = builder.bitcast(builder.shuffle_vector(b, b, ir.Constant(ir.VectorType(_I32, 64), list(range(16)) * 4)), _ZW)
        n = builder.and_(builder.lshr(words, ir.Constant(_ZW, list(_DEALT_SHIFTS))), _const(_ZW, 15))
        return _word_lookup(builder, n, MXFP4_PLUS12) if fp4 else n
    return codegen


@intrinsic
def zwnib_dealt(typingctx, f, o):
    """The 32 nibbles of the 16 bytes f[o:o + 16] (a Q4_0 or Q4_1 block's) as int16 lanes, in
    the order DEALT."""
    return i16x32(f, types.intp), _dealt_codegen(fp4=False)


@intrinsic
def zwfp4_dealt(typingctx, f, o):
    """zwnib_dealt for an MXFP4 block: its values plus 12 (MXFP4_PLUS12[q], 0..24)."""
    return i16x32(f, types.intp), _dealt_codegen(fp4=True)


@intrinsic
def hdeal(typingctx, src, so, dst, do):
    """dst[do:do + 32] = the 32 int16 src[so:so + 32] in the order DEALT."""
    def codegen(context, builder, sig, args):
        v = builder.load(_address(context, builder, sig.args[0], args[0], args[1], _I16, 32), align=2)
        v = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, 32), list(DEALT)))
        builder.store(v, _address(context, builder, sig.args[2], args[2], args[3], _I16, 32), align=2)
        return context.get_dummy_value()
    return types.void(src, types.intp, dst, types.intp), codegen


# -- 4-bit blocks in panels of sixteen rows (lpanels.py) ----------------------------------------------
def _panel_codegen(s: int, table, signed: bool):
    """Nibble s of each of 32 little-endian words at f[o:o + 64], through `table` (None: the
    nibble itself), as int16 lanes; `signed`: the table's bytes are signed values."""
    def codegen(context, builder, sig, args):
        words = builder.load(_address(context, builder, sig.args[0], args[0], args[1], _I16, 32), align=1)
        n = builder.lshr(words, _const(_ZW, 4 * s)) if s else words
        if s != 3:
            n = builder.and_(n, _const(_ZW, 15))
        if table is None:
            return n
        if not signed:
            return _word_lookup(builder, n, table)
        # the values' bytes as unsigned (-12 is 244), then each lane's low byte sign-extended
        v = _word_lookup(builder, n, [v & 255 for v in table])
        return builder.sext(builder.trunc(v, ir.VectorType(_I8, 32)), _ZW)
    return codegen


def _panel_step(name, table, signed, doc):
    def step(typingctx, f, o, s):
        if not isinstance(s, types.IntegerLiteral):
            return None
        return i16x32(f, types.intp, s), _panel_codegen(s.literal_value, table, signed)
    step.__name__ = step.__qualname__ = name
    step.__doc__ = doc
    return intrinsic(step)


zwnib_step = _panel_step("zwnib_step", None, False, "Step s (a literal, 0..3) of the 64 bytes f[o:o + 64] of a "
                         "panel (lpanels.py): nibble s of each of its 32 little-endian words, as int16 lanes (0..15).")
zwfp4_step = _panel_step("zwfp4_step", MXFP4_PLUS12, False, "zwnib_step through MXFP4_PLUS12 (0..24).")
zwfp4_step_signed = _panel_step("zwfp4_step_signed", MXFP4_VALUES, True,
                                "zwnib_step through MXFP4_VALUES (-12..12): lgemm's panels.")


def _half_load(name, result, vec, doc):
    """An intrinsic `name`(f, o): vec's count of IEEE halves at byte o of a byte array, widened
    to float32 lanes (one vcvtph2ps), typed `result`."""
    def halves(typingctx, f, o):
        def codegen(context, builder, sig, args):
            h = builder.load(_address(context, builder, sig.args[0], args[0], args[1], ir.HalfType(), vec.count),
                             align=1)
            return builder.fpext(h, vec)
        return result(f, types.intp), codegen
    halves.__name__ = halves.__qualname__ = name
    halves.__doc__ = doc
    return intrinsic(halves)


fhalf16 = _half_load("fhalf16", f32x16, _VF, "16 IEEE halves at bytes f[o:o + 32] of a byte array, as float32 lanes.")


@intrinsic
def e8m0vec16(typingctx, f, o):
    """The sixteen MXFP4 scales whose E8M0 bytes are f[o:o + 16], as float32 lanes (lanes.e8m0_bits)."""
    def codegen(context, builder, sig, args):
        b = builder.load(_address(context, builder, sig.args[0], args[0], args[1], _I8, 16), align=1)
        return builder.bitcast(e8m0_bits(builder, builder.zext(b, _Z)), _VF)
    return f32x16(f, types.intp), codegen


@intrinsic
def u64at(typingctx, f, o):
    """The little-endian 8 bytes f[o:o + 8] of a byte array as one uint64 (no alignment)."""
    def codegen(context, builder, sig, args):
        return builder.load(_address(context, builder, sig.args[0], args[0], args[1], ir.IntType(64), 1), align=1)
    return types.uint64(f, types.intp), codegen


def mask_runs(mask: int) -> list[tuple[int, int, int]]:
    """The runs of ones in a 64-bit mask as (first bit, length, where pext puts them): pext
    without BMI2 is a shift and a mask a run."""
    runs, bit, at = [], 0, 0
    while bit < 64:
        if not (mask >> bit) & 1:
            bit += 1
            continue
        end = bit
        while end < 64 and (mask >> end) & 1:
            end += 1
        runs.append((bit, end - bit, at))
        at += end - bit
        bit = end
    return runs


@intrinsic
def pext(typingctx, x, mask):
    """The bits of x where `mask` (an integer literal) has ones, packed into the low bits: BMI2's
    pext where the machine has it, elsewhere a shift and a mask for each run of ones (mask_runs)."""
    if not isinstance(mask, types.IntegerLiteral):
        return None
    m = mask.literal_value & (2 ** 64 - 1)

    def codegen(context, builder, sig, args):
        i64 = ir.IntType(64)
        v = context.cast(builder, args[0], sig.args[0], types.uint64)
        if "bmi2" in target_features():
            return _x86(builder, "llvm.x86.bmi.pext.64", i64, [v, ir.Constant(i64, m)])
        out = ir.Constant(i64, 0)
        for bit, length, at in mask_runs(m):
            part = builder.and_(builder.lshr(v, ir.Constant(i64, bit)), ir.Constant(i64, (1 << length) - 1))
            out = builder.or_(out, builder.shl(part, ir.Constant(i64, at)))
        return out
    return types.uint64(x, mask), codegen


zhstore = _vector_store("zhstore", i16x32, _I16, 32, 1, "f[o:o + 32] = the 32 int16 v (f any array: o in its elements).")


@intrinsic
def wbits(typingctx, f, o, value):
    """The 16 bits of the little-endian uint16 f[o:o + 2] as int16 lanes: `value` where bit i is
    set, else 0 (half of a Q5_0 or Q5_1 block's fifth bits, value 16)."""
    def codegen(context, builder, sig, args):
        h = builder.load(_address(context, builder, sig.args[0], args[0], args[1], _I16, 1), align=1)
        bits = builder.bitcast(h, ir.VectorType(_I1, 16))
        v = builder.trunc(_int(context, builder, args[2], sig.args[2]), _I16)
        return builder.select(bits, _splat(builder, v, _W), _const(_W, 0))
    return i16x16(f, types.intp, value), codegen


@intrinsic
def kscales(typingctx, f, o):
    """The 8 scales (lanes 0-7) and 8 mins (lanes 8-15) of a Q4_K/Q5_K super-block, 6 bits each,
    packed in the 12 bytes f[o:o + 12], as int16."""
    def codegen(context, builder, sig, args):
        return builder.zext(kscale_bytes(context, builder, sig, args), _W)
    return i16x16(f, types.intp), codegen


@intrinsic
def wsplat(typingctx, v, i):
    """Lane i of v in all 16 lanes."""
    def codegen(context, builder, sig, args):
        return _splat(builder, builder.extract_element(args[0], _int(context, builder, args[1], sig.args[1])), _W)
    return i16x16(i16x16, i), codegen


@intrinsic
def wpair(typingctx, v, i):
    """Lane i of v in lanes 0-7, lane i + 1 in lanes 8-15: the scales of two runs of 16 weights
    against maddubs' products (8 int16 lanes each)."""
    def codegen(context, builder, sig, args):
        i = _int(context, builder, args[1], sig.args[1])
        a = _splat(builder, builder.extract_element(args[0], i), _W)
        b = _splat(builder, builder.extract_element(args[0], builder.add(i, ir.Constant(_I32, 1))), _W)
        return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(_I32, 16), list(range(8)) + list(range(24, 32))))
    return i16x16(i16x16, i), codegen


@intrinsic
def ifloat(typingctx, v):
    """The integer lanes as float32: 16 int16 or 16 int32 (a f32x16), or 8 int32 (a f32x8)."""
    result = {i16x16: f32x16, i32x16: f32x16, i32x8: f32x8}.get(v)
    if result is None:
        return None

    def codegen(context, builder, sig, args):
        return builder.sitofp(args[0], context.get_value_type(sig.return_type))
    return result(v), codegen


# -- float sums ----------------------------------------------------------------------------------------
_FAST = ("reassoc", "contract", "arcp", "nsz")


fzero8 = _vector_zero("fzero8", f32x8, _F8, 0.0)


@intrinsic
def ifma(typingctx, acc, v, s):
    """acc + float(v) * s, for 8 int32 lanes v and a float scale s."""
    def codegen(context, builder, sig, args):
        s = _splat(builder, context.cast(builder, args[2], sig.args[2], types.float32), _F8)
        return builder.fadd(builder.fmul(builder.sitofp(args[1], _F8), s, flags=_FAST), args[0], flags=_FAST)
    return f32x8(f32x8, i32x8, s), codegen


@intrinsic
def fsum8(typingctx, v):
    """The sum of the 8 lanes."""
    def codegen(context, builder, sig, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_F32, [_F32, _F8]),
                                            "llvm.vector.reduce.fadd.v8f32")
        return builder.call(fn, [ir.Constant(_F32, 0.0), args[0]], fastmath=_FAST)
    return types.float32(f32x8), codegen


# -- one order of arithmetic (batch-invariant products: ldot.l_rows, qdot.k_tail) ------------------------
@intrinsic
def fma8(typingctx, a, b, c):
    """a * b + c lane by lane, rounded once, never reassociated (lanes._exact_fma)."""
    return f32x8(f32x8, f32x8, f32x8), lambda context, builder, sig, args: _exact_fma(builder, args, _F8)


@intrinsic
def f16vec8(typingctx, f, o0, o1, o2, o3, o4, o5, o6, o7):
    """The IEEE halves at bytes f[o_i:o_i + 2] as one f32x8, o0's in lane 0: eight loads into
    one half vector and one conversion (vcvtph2ps), not eight."""
    def codegen(context, builder, sig, args):
        hv = ir.VectorType(ir.HalfType(), 8)
        v = ir.Constant(hv, ir.Undefined)
        for i, o in enumerate(args[1:]):
            p = _address(context, builder, sig.args[0], args[0], o, ir.HalfType(), 1)
            v = builder.insert_element(v, builder.load(p, align=1), ir.Constant(_I32, i))
        return builder.fpext(v, _F8)
    return f32x8(f, *([types.intp] * 8)), codegen


@intrinsic
def e8m0vec8(typingctx, f, o0, o1, o2, o3, o4, o5, o6, o7):
    """f16vec8 for MXFP4's scales: 2^(f[o_i] - 128) (lanes.e8m0_bits) as one f32x8, o0's in lane 0."""
    def codegen(context, builder, sig, args):
        v = ir.Constant(_D, ir.Undefined)
        for i, o in enumerate(args[1:]):
            e = builder.load(_address(context, builder, sig.args[0], args[0], o, _I8, 1), align=1)
            v = builder.insert_element(v, builder.zext(e, _I32), ir.Constant(_I32, i))
        return builder.bitcast(e8m0_bits(builder, v), _F8)
    return f32x8(f, *([types.intp] * 8)), codegen


def _even_odd_sum(builder, a, b):
    """Lanes (a0 + a1, a2 + a3, .., b0 + b1, ..): adjacent pairs of a, then of b, summed."""
    n = a.type.count
    evens = builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(_I32, n), list(range(0, 2 * n, 2))))
    odds = builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(_I32, n), list(range(1, 2 * n, 2))))
    return builder.add(evens, odds)


@intrinsic
def isums8(typingctx, a, b, c, d, e, f, g, h):
    """Lane i: the sum of the eight int32 lanes of the i-th argument (eight i32x8): eight rows'
    block sums side by side, exact, in three levels of pairwise adds."""
    if any(t != i32x8 for t in (a, b, c, d, e, f, g, h)):
        return None

    return i32x8(a, b, c, d, e, f, g, h), lambda context, builder, sig, args: _pairwise(builder, args)


def _pairwise(builder, v):
    """The even/odd sums of pairs of the vectors v, level by level, down to one vector."""
    while len(v) > 1:
        v = [_even_odd_sum(builder, v[i], v[i + 1]) for i in range(0, len(v), 2)]
    return v[0]


@intrinsic
def zisums8(typingctx, a, b, c, d, e, f, g, h):
    """isums8 of eight i32x16: lane i the sum of the i-th argument's 16 lanes, exact (after
    isums8's three levels, lanes 2i and 2i + 1 hold the i-th argument's halves)."""
    if any(t != i32x16 for t in (a, b, c, d, e, f, g, h)):
        return None
    return i32x8(a, b, c, d, e, f, g, h), lambda context, builder, sig, args: _pairs(builder, _pairwise(builder, args), _D)


fload8 = _vector_load("fload8", f32x8, _F32, 8, 4, "The 8 float32 f[o:o + 8].")


fstore8 = _vector_store("fstore8", f32x8, _F32, 8, 4, "f[o:o + 8] = v (8 float32).")


@intrinsic
def flane8(typingctx, v, i):
    """Lane i of an f32x8 (i a constant where it matters: one extract)."""
    def codegen(context, builder, sig, args):
        return builder.extract_element(args[0], _int(context, builder, args[1], sig.args[1]))
    return types.float32(f32x8, i), codegen


@intrinsic
def fquad8(typingctx, a, b, c, d):
    """(a, b, c, d, a, b, c, d) as an f32x8: four rows' scales, once for each half."""
    def codegen(context, builder, sig, args):
        v = ir.Constant(_F8, ir.Undefined)
        for i in range(8):
            x = context.cast(builder, args[i % 4], sig.args[i % 4], types.float32)
            v = builder.insert_element(v, x, ir.Constant(_I32, i))
        return v
    return f32x8(a, b, c, d), codegen


@intrinsic
def fhigh4(typingctx, v):
    """Lanes 4-7 of an f32x8 in lanes 0-3 (and 4-7)."""
    def codegen(context, builder, sig, args):
        return builder.shuffle_vector(args[0], args[0], ir.Constant(ir.VectorType(_I32, 8), [4, 5, 6, 7] * 2))
    return f32x8(f32x8), codegen


@intrinsic
def ffma8(typingctx, a, b, c):
    """a * b + c, lane by lane."""
    def codegen(context, builder, sig, args):
        return builder.fadd(builder.fmul(args[0], args[1], flags=_FAST), args[2], flags=_FAST)
    return f32x8(f32x8, f32x8, f32x8), codegen


@intrinsic
def fmul8(typingctx, a, b):
    def codegen(context, builder, sig, args):
        return builder.fmul(args[0], args[1], flags=_FAST)
    return f32x8(f32x8, f32x8), codegen


@intrinsic
def vamax(typingctx, v):
    """The largest |lane| of a f32x16."""
    def codegen(context, builder, sig, args):
        fabs = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VF, [_VF]), "llvm.fabs.v16f32")
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_F32, [_VF]), "llvm.vector.reduce.fmax.v16f32")
        return builder.call(fn, [builder.call(fabs, [args[0]])])
    return types.float32(f32x16), codegen


@intrinsic
def vamax2(typingctx, a, b):
    """The largest |lane| of two f32x16 (one reduction for both)."""
    def codegen(context, builder, sig, args):
        fabs = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VF, [_VF]), "llvm.fabs.v16f32")
        vmax = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VF, [_VF, _VF]), "llvm.maxnum.v16f32")
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_F32, [_VF]), "llvm.vector.reduce.fmax.v16f32")
        m = builder.call(vmax, [builder.call(fabs, [args[0]]), builder.call(fabs, [args[1]])])
        return builder.call(fn, [m])
    return types.float32(f32x16, f32x16), codegen


@intrinsic
def vrint(typingctx, v):
    """v rounded to the nearest integer, ties to even (the current rounding mode's)."""
    def codegen(context, builder, sig, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VF, [_VF]), "llvm.rint.v16f32")
        return builder.call(fn, [args[0]])
    return f32x16(f32x16), codegen


@intrinsic
def vstore_i8(typingctx, arr, idx, v):
    """arr[idx:idx + 16] = v as int8, for lanes that hold integers in [-128, 127]."""
    def codegen(context, builder, sig, args):
        q = builder.trunc(builder.fptosi(args[2], _W32), ir.VectorType(_I8, 16))
        builder.store(q, _address(context, builder, sig.args[0], args[0], args[1], _I8, 16), align=1)
        return context.get_dummy_value()
    return types.void(arr, types.intp, f32x16), codegen


@intrinsic
def vstore_i16(typingctx, arr, idx, v):
    """arr[idx:idx + 16] = v as int16, for lanes that hold integers in [-32768, 32767]."""
    def codegen(context, builder, sig, args):
        q = builder.trunc(builder.fptosi(args[2], _W32), _W)
        builder.store(q, _address(context, builder, sig.args[0], args[0], args[1], _I16, 16), align=2)
        return context.get_dummy_value()
    return types.void(arr, types.intp, f32x16), codegen


# -- kpanels' stored panels ----------------------------------------------------------------------------
bstore = _vector_store("bstore", i8x32, _I8, 32, 1, "f[o:o + 32] = the 32 bytes v (f a byte array).")


@intrinsic
def iload_u8(typingctx, f, o):
    """The 8 bytes f[o:o + 8] of a uint8 array, zero-extended to int32 lanes."""
    def codegen(context, builder, sig, args):
        b = builder.load(_address(context, builder, sig.args[0], args[0], args[1], _I8, 8), align=1)
        return builder.zext(b, _D)
    return i32x8(f, types.intp), codegen


fhalf8 = _half_load("fhalf8", f32x8, _F8, "8 IEEE halves at bytes f[o:o + 16] of a uint8 array, as float32 lanes.")
