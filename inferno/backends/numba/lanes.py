"""16-lane float32 vectors for Numba kernels: LLVM's `<16 x float>`, lowered for whatever the
machine has (one AVX-512 register, two AVX2 registers, four SSE or NEON ones).

Why not plain loops: Numba runs LLVM's loop vectoriser but not its SLP vectoriser, and LLVM
fully unrolls a short constant loop (the 16 or 32 weights of a GGML block) before the loop
vectoriser sees it. Decoding a block that way came out as scalar code, several times slower
than the same work written with these vectors (bench/RESULTS.md, "Figures behind the kernels' shape").
A vector value lives in a register, so accumulators never round-trip through memory.

Byte loads read GGML blocks in place from a flat uint8 array (`f`, at byte offset `o`), with no
alignment assumed and no bounds or negative-index checks: callers index inside their arrays.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

LANES = 16
_FAST = ("reassoc", "contract", "arcp", "nsz")  # dense.FAST, as LLVM flags
# The flags of an add that must stay where it is written: Numba's fast-math pass gives every
# float add without flags the kernel's (reassoc among them), so an exact add needs flags of its
# own; arcp (reciprocals in divisions) moves no add.
_STRICT = ("arcp",)
_F32 = ir.FloatType()
_VF = ir.VectorType(_F32, LANES)
_I8, _I16, _I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)


class F32x16(types.Type):
    def __init__(self):
        super().__init__(name="f32x16")


f32x16 = F32x16()


@register_model(F32x16)
class _F32x16Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _VF)


def _vec(n, value):
    return ir.Constant(ir.VectorType(_I32 if isinstance(value, int) else _F32, n), [value] * n)


def _splat(builder, scalar, ty):
    undef = ir.Constant(ir.VectorType(ty, LANES), ir.Undefined)
    v = builder.insert_element(undef, scalar, ir.Constant(_I32, 0))
    return builder.shuffle_vector(v, undef, _vec(LANES, 0))


def _address(context, builder, aty, arr, idx, elem, count=LANES):
    """Pointer to `count` elements of type `elem` at element idx of a C-contiguous array."""
    data = context.make_array(aty)(context, builder, arr).data
    p = builder.gep(data, [idx], inbounds=True)
    return builder.bitcast(p, (ir.VectorType(elem, count) if count > 1 else elem).as_pointer())


def _load_bytes(context, builder, aty, arr, idx, elem=_I8):
    return builder.load(_address(context, builder, aty, arr, idx, elem), align=1)


def _as_i32(context, builder, value, fromty):
    return context.cast(builder, value, fromty, types.int32)


# -- arithmetic ------------------------------------------------------------------------------------
@intrinsic
def vzero(typingctx):
    return f32x16(), lambda context, builder, sig, args: ir.Constant(_VF, [0.0] * LANES)


@intrinsic
def vsplat(typingctx, x):
    """x in every lane."""
    def codegen(context, builder, sig, args):
        return _splat(builder, context.cast(builder, args[0], sig.args[0], types.float32), _F32)
    return f32x16(x), codegen


@intrinsic
def vhalves(typingctx, a, b):
    """a in lanes 0-7, b in lanes 8-15."""
    def codegen(context, builder, sig, args):
        va, vb = (_splat(builder, context.cast(builder, v, t, types.float32), _F32)
                  for v, t in zip(args, sig.args))
        return builder.shuffle_vector(va, vb, ir.Constant(ir.VectorType(_I32, LANES),
                                                          list(range(8)) + list(range(24, 32))))
    return f32x16(a, b), codegen


def _binary(op):
    @intrinsic
    def fn(typingctx, a, b):
        def codegen(context, builder, sig, args):
            return getattr(builder, op)(args[0], args[1], flags=_FAST)
        return f32x16(f32x16, f32x16), codegen
    return fn


vadd = _binary("fadd")
vmul = _binary("fmul")


@intrinsic
def vfma(typingctx, a, b, c):
    """a * b + c, fused where the machine has FMA (the kernels' fastmath allows contraction)."""
    def codegen(context, builder, sig, args):
        return builder.fadd(builder.fmul(args[0], args[1], flags=_FAST), args[2], flags=_FAST)
    return f32x16(f32x16, f32x16, f32x16), codegen


def _exact_fma(builder, args, vty):
    """llvm.fma on three float32 vectors of type vty: a * b + c lane by lane, rounded once. The
    kernels' fast-math lets LLVM reassociate and contract their adds; a sum that must come out
    the same bit for bit in two kernels (the legacy kinds' products) is written with this, which
    it leaves as it is."""
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vty, [vty] * 3),
                                        f"llvm.fma.v{vty.count}f32")
    return builder.call(fn, list(args))


@intrinsic
def vfma_exact(typingctx, a, b, c):
    """a * b + c rounded once, never reassociated (`_exact_fma`)."""
    return f32x16(f32x16, f32x16, f32x16), lambda context, builder, sig, args: _exact_fma(builder, args, _VF)


@intrinsic
def sfma(typingctx, a, b, c):
    """a * b + c for three float32 scalars, rounded once, never reassociated: the scalar spelling
    of `vfma_exact`, so a kernel that sums one row at a time matches one that sums a row per lane."""
    def codegen(context, builder, sig, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_F32, [_F32] * 3), "llvm.fma.f32")
        return builder.call(fn, [context.cast(builder, v, t, types.float32) for v, t in zip(args, sig.args)])
    return types.float32(a, b, c), codegen


@intrinsic
def vsum(typingctx, v):
    """The sum of the 16 lanes (a reassociated tree reduction)."""
    def codegen(context, builder, sig, args):
        fnty = ir.FunctionType(_F32, [_F32, _VF])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.vector.reduce.fadd.v16f32")
        return builder.call(fn, [ir.Constant(_F32, 0.0), args[0]], fastmath=_FAST)
    return types.float32(f32x16), codegen


@intrinsic
def vadd_exact(typingctx, a, b):
    """a + b lane by lane, never reassociated or contracted with what made a or b."""
    return f32x16(f32x16, f32x16), lambda context, builder, sig, args: builder.fadd(args[0], args[1], flags=_STRICT)


@intrinsic
def vsum_exact(typingctx, v):
    """The sum of the 16 lanes in one fixed order, never reassociated: halves added lane by lane
    (16 -> 8 -> 4 -> 2 -> 1), so two kernels that end a row's sum with it agree bit for bit."""
    def codegen(context, builder, sig, args):
        v = args[0]
        width = LANES
        while width > 1:
            half = width // 2
            lo = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, half), list(range(half))))
            hi = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, half), list(range(half, width))))
            v, width = builder.fadd(lo, hi, flags=_STRICT), half
        return builder.extract_element(v, ir.Constant(_I32, 0))
    return types.float32(f32x16), codegen


@intrinsic
def vsums_exact(typingctx, vs):
    """The lane sums of k vectors (a tuple; k = 2, 4, 8 or 16) in lanes 0..k - 1, each summed in
    vsum_exact's order: the vectors' halves are shuffled side by side so that one add serves
    several of them at every level of the tree (15 adds for 16 vectors, not 60)."""
    if not isinstance(vs, types.UniTuple) or vs.dtype != f32x16 or vs.count not in (2, 4, 8, 16):
        return None
    k = vs.count

    def codegen(context, builder, sig, args):
        vecs = [builder.extract_value(args[0], i) for i in range(k)]
        sources, width = 1, LANES  # each vector: `sources` runs of `width` lanes to sum
        while len(vecs) > 1:
            half = width // 2
            lo = [s * width + t for s in range(sources) for t in range(half)]
            hi = [s * width + half + t for s in range(sources) for t in range(half)]
            lo, hi = lo + [LANES + i for i in lo], hi + [LANES + i for i in hi]
            vecs = [builder.fadd(builder.shuffle_vector(p, q, ir.Constant(ir.VectorType(_I32, LANES), lo)),
                                 builder.shuffle_vector(p, q, ir.Constant(ir.VectorType(_I32, LANES), hi)), flags=_STRICT)
                    for p, q in zip(vecs[0::2], vecs[1::2])]
            sources, width = 2 * sources, half
        v = vecs[0]
        while width > 1:
            half = width // 2
            lo = [s * width + t for s in range(sources) for t in range(half)]
            hi = [s * width + half + t for s in range(sources) for t in range(half)]
            v = builder.fadd(builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, len(lo)), lo)),
                             builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, len(hi)), hi)), flags=_STRICT)
            width = half
        if k < LANES:  # back to sixteen lanes, the rest undefined
            v = builder.shuffle_vector(v, ir.Constant(v.type, ir.Undefined),
                                       ir.Constant(ir.VectorType(_I32, LANES), list(range(k)) + [k] * (LANES - k)))
        return v
    return f32x16(vs), codegen


@intrinsic
def vpairs_hi(typingctx, v):
    """Lanes 8 + g = v[2g] + v[2g + 1] (g < 8), lanes 0-7 zero: sums per 16 as sums per 32, in
    the lanes that hold a Q4_K super-block's mins (vkscales)."""
    def codegen(context, builder, sig, args):
        zero = ir.Constant(_VF, [0.0] * LANES)
        pick = lambda first: ir.Constant(ir.VectorType(_I32, LANES), [LANES] * 8 + list(range(first, LANES, 2)))  # noqa: E731
        even = builder.shuffle_vector(args[0], zero, pick(0))
        odd = builder.shuffle_vector(args[0], zero, pick(1))
        return builder.fadd(even, odd, flags=_FAST)
    return f32x16(f32x16), codegen


# -- float32 arrays --------------------------------------------------------------------------------
@intrinsic
def vload(typingctx, arr, idx):
    """16 float32 from element idx of arr on: arr.flat[idx:idx + 16] of a float32 array, or the
    float32 stored at bytes idx..idx + 64 of a uint8 one."""
    def codegen(context, builder, sig, args):
        return builder.load(_address(context, builder, sig.args[0], args[0], args[1], _F32), align=1)
    return f32x16(arr, types.intp), codegen


@intrinsic
def vstore(typingctx, arr, idx, v):
    """arr.flat[idx:idx + 16] = v for a float32 array."""
    def codegen(context, builder, sig, args):
        builder.store(args[2], _address(context, builder, sig.args[0], args[0], args[1], _F32), align=4)
        return context.get_dummy_value()
    return types.void(arr, types.intp, f32x16), codegen


# -- weights from bytes ----------------------------------------------------------------------------
@intrinsic
def f16at(typingctx, f, o):
    """The IEEE half at bytes f[o:o + 2], as float32 (exact: LLVM's fpext, F16C's vcvtph2ps)."""
    def codegen(context, builder, sig, args):
        h = builder.load(_address(context, builder, sig.args[0], args[0], args[1], ir.HalfType(), 1), align=1)
        return builder.fpext(h, _F32)
    return types.float32(f, types.intp), codegen


@intrinsic
def f32at(typingctx, f, o):
    """The float32 at bytes f[o:o + 4]."""
    def codegen(context, builder, sig, args):
        return builder.load(_address(context, builder, sig.args[0], args[0], args[1], _F32, 1), align=1)
    return types.float32(f, types.intp), codegen


@intrinsic
def bf16at(typingctx, f, o):
    """The bfloat16 at bytes f[o:o + 2], as float32 (its bits the float's top half)."""
    def codegen(context, builder, sig, args):
        h = builder.load(_address(context, builder, sig.args[0], args[0], args[1], _I16, 1), align=1)
        return builder.bitcast(builder.shl(builder.zext(h, _I32), ir.Constant(_I32, 16)), _F32)
    return types.float32(f, types.intp), codegen


@intrinsic
def u32at(typingctx, f, o):
    """The little-endian uint32 at bytes f[o:o + 4]."""
    def codegen(context, builder, sig, args):
        v = builder.load(_address(context, builder, sig.args[0], args[0], args[1], _I32, 1), align=1)
        return context.cast(builder, v, types.uint32, types.int64)
    return types.int64(f, types.intp), codegen


@intrinsic
def vf16(typingctx, f, o):
    """16 IEEE halves at bytes f[o:o + 32], as float32."""
    def codegen(context, builder, sig, args):
        h = _load_bytes(context, builder, sig.args[0], args[0], args[1], ir.HalfType())
        return builder.fpext(h, _VF)
    return f32x16(f, types.intp), codegen


@intrinsic
def vbf16(typingctx, f, o):
    """16 bfloat16 at bytes f[o:o + 32], as float32 (the top half of each float's bits)."""
    def codegen(context, builder, sig, args):
        h = _load_bytes(context, builder, sig.args[0], args[0], args[1], _I16)
        wide = builder.shl(builder.zext(h, ir.VectorType(_I32, LANES)), _vec(LANES, 16))
        return builder.bitcast(wide, _VF)
    return f32x16(f, types.intp), codegen


@intrinsic
def vi8(typingctx, f, o):
    """16 int8 at bytes f[o:o + 16], as float32."""
    def codegen(context, builder, sig, args):
        return builder.sitofp(_load_bytes(context, builder, sig.args[0], args[0], args[1]), _VF)
    return f32x16(f, types.intp), codegen


def _nibbles(context, builder, sig, args):
    """(f[o + lane] >> shift) & 15 as 16 int32 lanes, shift 0 (low nibbles) or 4 (high). (Doing
    this on int8 lanes measured slower: x86 has no byte shifts.)"""
    b = builder.zext(_load_bytes(context, builder, sig.args[0], args[0], args[1]), ir.VectorType(_I32, LANES))
    shift = _splat(builder, _as_i32(context, builder, args[2], sig.args[2]), _I32)
    return builder.and_(builder.lshr(b, shift), _vec(LANES, 15))


@intrinsic
def vnib(typingctx, f, o, shift):
    """16 four-bit values: (f[o + lane] >> shift) & 15, as float32."""
    def codegen(context, builder, sig, args):
        return builder.uitofp(_nibbles(context, builder, sig, args), _VF)
    return f32x16(f, types.intp, shift), codegen


def _mask_registers() -> bool:
    """Whether the code Numba compiles targets AVX-512 (its mask registers), by the feature
    string Numba itself uses (NUMBA_CPU_FEATURES, else the host's). Numba's cache is keyed on
    the target too, so code chosen by this is never run on a machine without."""
    from numba.core import config
    from numba.core.codegen import get_host_cpu_features

    features = config.CPU_FEATURES if config.CPU_FEATURES is not None else get_host_cpu_features()
    return "+avx512f" in features.split(",")


@intrinsic
def vnib5(typingctx, f, o, shift, qh, bit0):
    """16 five-bit values of Q5_0/Q5_1: the nibble as vnib, plus bit (bit0 + lane) of the uint32
    qh as the fifth bit; bit0 (0 or 16) a literal. With AVX-512, qh is taken as 32 one-bit lanes
    that move into a mask register whole; without, that is scalar code (several times slower),
    so each lane tests its bit against a constant (bench/RESULTS.md, "Figures behind the kernels' shape")."""
    if not isinstance(bit0, types.IntegerLiteral):
        return None
    first = bit0.literal_value

    def codegen(context, builder, sig, args):
        low = _nibbles(context, builder, sig, args)
        qh = _as_i32(context, builder, args[3], sig.args[3])
        lanes = list(range(first, first + LANES))
        if _mask_registers():
            bits = builder.bitcast(qh, ir.VectorType(ir.IntType(1), 32))
            set_ = builder.shuffle_vector(bits, ir.Constant(bits.type, ir.Undefined),
                                          ir.Constant(ir.VectorType(_I32, LANES), lanes))
        else:
            mask = ir.Constant(ir.VectorType(_I32, LANES), [1 << b for b in lanes])
            set_ = builder.icmp_unsigned("!=", builder.and_(_splat(builder, qh, _I32), mask), _vec(LANES, 0))
        return builder.uitofp(builder.or_(low, builder.select(set_, _vec(LANES, 16), _vec(LANES, 0))), _VF)
    return f32x16(f, types.intp, shift, qh, bit0), codegen


@intrinsic
def vnibhi(typingctx, f, o, shift, oh, hshift, hmask, bias):
    """16 values of the K-quants: the nibble as vnib, plus ((f[oh + lane] >> hshift) & hmask)
    as the bits above it (Q5_K: one bit; Q6_K: two), minus bias (Q6_K: 32)."""
    def codegen(context, builder, sig, args):
        low = _nibbles(context, builder, sig, args)
        h = builder.zext(_load_bytes(context, builder, sig.args[0], args[0], args[3]), ir.VectorType(_I32, LANES))
        hshift, hmask, bias = (_splat(builder, _as_i32(context, builder, args[i], sig.args[i]), _I32)
                               for i in (4, 5, 6))
        q = builder.or_(low, builder.shl(builder.and_(builder.lshr(h, hshift), hmask), _vec(LANES, 4)))
        return builder.sitofp(builder.sub(q, bias), _VF)
    return f32x16(f, types.intp, shift, types.intp, hshift, hmask, bias), codegen


# ggml's kvalues_mxfp4: the E2M1 values doubled, by nibble (sign in bit 3), so that they are
# integers; an MXFP4 block's scale 2^(e - 128) carries the halving (e8m0_bits).
MXFP4_VALUES = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)


def _pshufb() -> bool:
    """Whether the code Numba compiles targets x86 with SSSE3 (pshufb: a 16-entry byte table)."""
    from numba.core import config
    from numba.core.codegen import get_host_cpu_features

    features = config.CPU_FEATURES if config.CPU_FEATURES is not None else get_host_cpu_features()
    return "+ssse3" in features.split(",")


def fp4_values(builder, nibbles):
    """MXFP4_VALUES[n] for 16 nibbles n (<16 x i8>, 0..15), as <16 x i8>: one pshufb on x86,
    elsewhere a select per table entry (correct, not fast)."""
    table = ir.Constant(ir.VectorType(_I8, 16), list(MXFP4_VALUES))
    if _pshufb():
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(table.type, [table.type] * 2),
                                            "llvm.x86.ssse3.pshuf.b.128")
        return builder.call(fn, [table, nibbles])
    out = ir.Constant(table.type, [0] * 16)
    for n, v in enumerate(MXFP4_VALUES):
        hit = builder.icmp_unsigned("==", nibbles, ir.Constant(table.type, [n] * 16))
        out = builder.select(hit, ir.Constant(table.type, [v] * 16), out)
    return out


def e8m0_bits(builder, e):
    """The float32 bits of an MXFP4 scale 2^(e - 128) for e (i32 or a vector of i32, 0..255):
    ggml's GGML_E8M0_TO_FP32_HALF and the gguf package's e8m0_to_fp32_half, e 0 and 1 subnormal
    (0x00200000 << e), e 255 2^127."""
    c = lambda v: ir.Constant(e.type, [v] * e.type.count if isinstance(e.type, ir.VectorType) else v)  # noqa: E731
    return builder.select(builder.icmp_unsigned("<", e, c(2)), builder.shl(c(0x00200000), e),
                          builder.shl(builder.sub(e, c(1)), c(23)))


@intrinsic
def e8m0at(typingctx, f, o):
    """The MXFP4 scale whose E8M0 byte is f[o], as float32: 2^(f[o] - 128) (e8m0_bits)."""
    def codegen(context, builder, sig, args):
        e = builder.load(_address(context, builder, sig.args[0], args[0], args[1], _I8, 1), align=1)
        return builder.bitcast(e8m0_bits(builder, builder.zext(e, _I32)), _F32)
    return types.float32(f, types.intp), codegen


@intrinsic
def vfp4(typingctx, f, o, shift):
    """16 MXFP4 weights' integers: MXFP4_VALUES[(f[o + lane] >> shift) & 15], as float32 (shift
    0: the low nibbles, weights 0-15 of the block; 4: the high ones, 16-31)."""
    def codegen(context, builder, sig, args):
        n = builder.trunc(_nibbles(context, builder, sig, args), ir.VectorType(_I8, LANES))
        return builder.sitofp(fp4_values(builder, n), _VF)
    return f32x16(f, types.intp, shift), codegen


def kscale_bytes(context, builder, sig, args):
    """The 8 scales and 8 mins of a Q4_K/Q5_K super-block, 6 bits each, packed in the 12 bytes
    f[o:o + 12] (args: f, o), as <16 x i8> (ggml's get_scale_min_k4, as its AVX2 code unpacks
    them: three 32-bit words, masks and shifts)."""
    words = builder.load(_address(context, builder, sig.args[0], args[0], args[1], _I32, 3), align=1)
    u0, u1, u2 = (builder.extract_element(words, ir.Constant(_I32, i)) for i in range(3))
    k1, k2, k3 = (ir.Constant(_I32, v) for v in (0x3F3F3F3F, 0x0F0F0F0F, 0x03030303))

    def top2(u):  # each byte's top two bits, moved to bits 4-5
        return builder.shl(builder.and_(builder.lshr(u, ir.Constant(_I32, 6)), k3), ir.Constant(_I32, 4))
    sc_lo, mn_lo = builder.and_(u0, k1), builder.and_(u1, k1)
    sc_hi = builder.or_(builder.and_(u2, k2), top2(u0))
    mn_hi = builder.or_(builder.and_(builder.lshr(u2, ir.Constant(_I32, 4)), k2), top2(u1))
    packed = ir.Constant(ir.VectorType(_I32, 4), ir.Undefined)
    for i, v in enumerate((sc_lo, sc_hi, mn_lo, mn_hi)):
        packed = builder.insert_element(packed, v, ir.Constant(_I32, i))
    return builder.bitcast(packed, ir.VectorType(_I8, LANES))


@intrinsic
def vkscales(typingctx, f, o):
    """The 8 scales (lanes 0-7) and 8 mins (lanes 8-15) of a Q4_K/Q5_K super-block
    (kscale_bytes), as float32: one widening of the 16 bytes."""
    def codegen(context, builder, sig, args):
        return builder.uitofp(kscale_bytes(context, builder, sig, args), _VF)
    return f32x16(f, types.intp), codegen


@intrinsic
def stack_f32(typingctx, n):
    """A pointer to n float32 on the stack (n a literal), for nb.carray: scratch that LLVM may
    keep in registers, unlike an np.empty."""
    if not isinstance(n, types.IntegerLiteral):
        return None
    size = n.literal_value

    def codegen(context, builder, sig, args):
        return cgutils.alloca_once(builder, _F32, size=size)
    return types.CPointer(types.float32)(n), codegen


def target_cpu() -> str:
    """The CPU Numba compiles for, as LLVM names it (znver4, sapphirerapids, ...):
    NUMBA_CPU_NAME if set, else the host's."""
    from llvmlite import binding
    from numba.core import config

    return config.CPU_NAME or binding.get_host_cpu_name()


def prefetch_locality(cpu: str) -> int:
    """LLVM's locality for `prefetch` on this CPU: 3 (x86's prefetcht0, into L1) on AMD's cores,
    2 (prefetcht1, into L2) elsewhere. Measured both ways on each vendor (bench/RESULTS.md,
    "Decode: the weights' prefetch into L2 instead of L1" for Intel, "The weights' prefetch on
    AMD" for Zen 4): on an Intel host a prefetch into L1 holds one of the core's few L1 miss
    buffers until its line arrives, and into L2 decode ran 1.06-1.12x faster; on Zen 4 the
    prefetch into L2 left one core's matvec streaming from DRAM at half the rate it reads with
    prefetches into L1."""
    return 3 if cpu.startswith(("znver", "bdver", "btver")) else 2


PREFETCH_LOCALITY = prefetch_locality(target_cpu())


@intrinsic
def prefetch(typingctx, f, o):
    """Hint that the bytes from f[o] on will be read soon (a no-op where the target has no
    prefetch). o may lie past the end: a prefetch never faults (x86, ARM), and the address is
    computed without LLVM's in-bounds promise. The weight streams of a matvec need it: one
    prefetch per block, a row pass ahead, tripled one core's read rate from DRAM (bench/RESULTS.md,
    "Figures behind the kernels' shape"). Into L1 or L2 as the CPU's vendor wants it
    (PREFETCH_LOCALITY); a non-temporal one halved the rate on Intel ("Prefill on an Intel host")."""
    return types.void(f, types.intp), _prefetch_codegen(PREFETCH_LOCALITY)


@intrinsic
def prefetch_l2(typingctx, f, o):
    """`prefetch` into L2 on every CPU (x86's prefetcht1): for kernels that read their weights
    fast enough that prefetches into L1 would hold the core's L1 miss buffers (kpanels.py)."""
    return types.void(f, types.intp), _prefetch_codegen(2)


def _prefetch_codegen(locality):
    def codegen(context, builder, sig, args):
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        p = builder.gep(builder.bitcast(data, _I8.as_pointer()), [args[1]])
        fnty = ir.FunctionType(ir.VoidType(), [p.type, _I32, _I32, _I32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        builder.call(fn, [p, ir.Constant(_I32, 0), ir.Constant(_I32, locality), ir.Constant(_I32, 1)])
        return context.get_dummy_value()
    return codegen


@intrinsic
def f16bits(typingctx, x):
    """The IEEE half nearest float32 x (ties to even, as numpy's astype(float16)), as its bits."""
    def codegen(context, builder, sig, args):
        h = builder.fptrunc(context.cast(builder, args[0], sig.args[0], types.float32), ir.HalfType())
        return builder.bitcast(h, _I16)
    return types.uint16(x), codegen
