//! Element-wise reduction of received bytes into local ones. bf16 and f16 are widened to f32
//! for the arithmetic and rounded back once per hop (what NCCL does), in blocks on the stack
//! so nothing is allocated per element.

use super::super::dtype::Dtype;
use super::super::{CommError, ReduceOp};
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

const BLOCK: usize = 512;

/// `dst = (dst ⊕ src) / divisor` element-wise, on byte views of `dtype` elements.
pub fn reduce(
    dst: &mut [u8],
    src: &[u8],
    dtype: Dtype,
    op: ReduceOp,
    divisor: Option<f32>,
) -> Result<(), CommError> {
    if dst.len() != src.len() {
        return Err(CommError::Other(format!(
            "reduce of {} bytes into {} bytes",
            src.len(),
            dst.len()
        )));
    }
    match dtype {
        Dtype::F32 => {
            let (d, s) = (cast_mut::<f32>(dst)?, cast::<f32>(src)?);
            combine_f32(d, s, op);
            if let Some(div) = divisor {
                d.iter_mut().for_each(|x| *x /= div);
            }
        }
        Dtype::F64 => {
            let (d, s) = (cast_mut::<f64>(dst)?, cast::<f64>(src)?);
            match op {
                ReduceOp::Sum | ReduceOp::Avg => d.iter_mut().zip(s).for_each(|(d, s)| *d += *s),
                ReduceOp::Max => d.iter_mut().zip(s).for_each(|(d, &s)| {
                    if s > *d || s.is_nan() {
                        *d = s
                    }
                }),
            }
            if let Some(div) = divisor {
                d.iter_mut().for_each(|x| *x /= f64::from(div));
            }
        }
        Dtype::BF16 => {
            let (d, s) = (cast_mut::<bf16>(dst)?, cast::<bf16>(src)?);
            widened(d, s, op, divisor, bf16_to_f32, bf16_from_f32);
        }
        Dtype::F16 => {
            let (d, s) = (cast_mut::<f16>(dst)?, cast::<f16>(src)?);
            widened(
                d,
                s,
                op,
                divisor,
                |h, f| h.convert_to_f32_slice(f),
                |h, f| h.convert_from_f32_slice(f),
            );
        }
    }
    Ok(())
}

fn combine_f32(dst: &mut [f32], src: &[f32], op: ReduceOp) {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => dst.iter_mut().zip(src).for_each(|(d, s)| *d += *s),
        // NaN wins, as in torch.maximum.
        ReduceOp::Max => dst.iter_mut().zip(src).for_each(|(d, &s)| {
            if s > *d || s.is_nan() {
                *d = s
            }
        }),
    }
}

fn widened<H: Copy>(
    dst: &mut [H],
    src: &[H],
    op: ReduceOp,
    divisor: Option<f32>,
    to_f32: impl Fn(&[H], &mut [f32]),
    from_f32: impl Fn(&mut [H], &[f32]),
) {
    let mut a = [0f32; BLOCK];
    let mut b = [0f32; BLOCK];
    for (d, s) in dst.chunks_mut(BLOCK).zip(src.chunks(BLOCK)) {
        let n = d.len();
        to_f32(d, &mut a[..n]);
        to_f32(s, &mut b[..n]);
        combine_f32(&mut a[..n], &b[..n], op);
        if let Some(div) = divisor {
            a[..n].iter_mut().for_each(|x| *x /= div);
        }
        from_f32(d, &a[..n]);
    }
}

/// bf16 is the top half of an f32: widening is a shift.
fn bf16_to_f32(h: &[bf16], f: &mut [f32]) {
    for (f, h) in f.iter_mut().zip(h) {
        *f = f32::from_bits(u32::from(h.to_bits()) << 16);
    }
}

/// Round to nearest even, quieting NaNs; branch-free so the loop vectorizes (the per-element
/// conversion in `half` does not, and made bf16 reductions conversion-bound).
fn bf16_from_f32(h: &mut [bf16], f: &[f32]) {
    for (h, f) in h.iter_mut().zip(f) {
        let bits = f.to_bits();
        let rounded = bits.wrapping_add(0x7FFF + ((bits >> 16) & 1)) >> 16;
        let nan = (bits & 0x7FFF_FFFF) > 0x7F80_0000;
        let out = if nan { (bits >> 16) | 0x40 } else { rounded };
        *h = bf16::from_bits(out as u16);
    }
}

/// Element views of byte buffers. Tensor data and the scratch buffer are aligned for their
/// dtype; a misaligned view is a bug, reported rather than risked.
fn cast<T: Element>(bytes: &[u8]) -> Result<&[T], CommError> {
    // SAFETY: T is a plain number type (f32, bf16, f16): every bit pattern is a valid value;
    // align_to puts only whole, aligned elements in the middle slice.
    let (head, body, tail) = unsafe { bytes.align_to::<T>() };
    if head.is_empty() && tail.is_empty() {
        Ok(body)
    } else {
        Err(CommError::Other("misaligned reduction buffer".to_string()))
    }
}

fn cast_mut<T: Element>(bytes: &mut [u8]) -> Result<&mut [T], CommError> {
    // SAFETY: as in `cast`; writes of any T value leave valid bytes.
    let (head, body, tail) = unsafe { bytes.align_to_mut::<T>() };
    if head.is_empty() && tail.is_empty() {
        Ok(body)
    } else {
        Err(CommError::Other("misaligned reduction buffer".to_string()))
    }
}

/// Types whose every bit pattern is a value.
trait Element: Copy {}
impl Element for f32 {}
impl Element for f64 {}
impl Element for bf16 {}
impl Element for f16 {}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes<T: Element>(v: &[T]) -> &[u8] {
        // SAFETY: reading the bytes of plain numbers.
        unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
    }

    fn bytes_mut<T: Element>(v: &mut [T]) -> &mut [u8] {
        // SAFETY: plain numbers; any bytes written back are valid values.
        unsafe {
            std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(v))
        }
    }

    #[test]
    fn f32_sum_avg_max() {
        let mut d = vec![1f32, 2.0, -3.0];
        let s = [4f32, -5.0, 6.0];
        reduce(
            bytes_mut(&mut d),
            bytes(&s),
            Dtype::F32,
            ReduceOp::Sum,
            None,
        )
        .unwrap();
        assert_eq!(d, vec![5.0, -3.0, 3.0]);
        reduce(
            bytes_mut(&mut d),
            bytes(&s),
            Dtype::F32,
            ReduceOp::Max,
            None,
        )
        .unwrap();
        assert_eq!(d, vec![5.0, -3.0, 6.0]);
        reduce(
            bytes_mut(&mut d),
            bytes(&s),
            Dtype::F32,
            ReduceOp::Avg,
            Some(2.0),
        )
        .unwrap();
        assert_eq!(d, vec![4.5, -4.0, 6.0]);
    }

    #[test]
    fn bf16_accumulates_in_f32_and_rounds_once() {
        // 256 + 1 is not representable in bf16 (8 bits of mantissa): 256 stays.
        let mut d: Vec<bf16> = [256f32, 1.5, 3.0]
            .iter()
            .map(|&x| bf16::from_f32(x))
            .collect();
        let s: Vec<bf16> = [1f32, 2.5, f32::NAN]
            .iter()
            .map(|&x| bf16::from_f32(x))
            .collect();
        reduce(
            bytes_mut(&mut d),
            bytes(&s),
            Dtype::BF16,
            ReduceOp::Sum,
            None,
        )
        .unwrap();
        assert_eq!(d[0].to_f32(), 256.0);
        assert_eq!(d[1].to_f32(), 4.0);
        assert!(d[2].is_nan());
    }

    #[test]
    fn bf16_conversions_match_half() {
        let values = [
            0.0f32,
            -0.0,
            1.0,
            1.0 + 1.0 / 256.0,
            1.0 + 3.0 / 256.0,
            -3.3e38,
            3.4e38,
            f32::INFINITY,
            1e-40,
            257.0,
            259.0,
        ];
        let mut narrow = vec![bf16::ZERO; values.len()];
        bf16_from_f32(&mut narrow, &values);
        for (n, v) in narrow.iter().zip(values) {
            assert_eq!(n.to_bits(), bf16::from_f32(v).to_bits(), "{v}");
        }
        let mut nan = [bf16::ZERO];
        bf16_from_f32(&mut nan, &[f32::NAN]);
        assert!(nan[0].is_nan());
        let mut wide = vec![0f32; values.len()];
        bf16_to_f32(&narrow, &mut wide);
        for (w, n) in wide.iter().zip(&narrow) {
            assert_eq!(w.to_bits(), n.to_f32().to_bits());
        }
    }

    #[test]
    fn f16_max_over_several_blocks() {
        let n = 3 * BLOCK + 7;
        let mut d: Vec<f16> = (0..n).map(|i| f16::from_f32((i % 100) as f32)).collect();
        let s: Vec<f16> = (0..n)
            .map(|i| f16::from_f32(((i + 50) % 100) as f32))
            .collect();
        reduce(
            bytes_mut(&mut d),
            bytes(&s),
            Dtype::F16,
            ReduceOp::Max,
            None,
        )
        .unwrap();
        for (i, x) in d.iter().enumerate() {
            assert_eq!(x.to_f32(), (i % 100).max((i + 50) % 100) as f32);
        }
    }
}
