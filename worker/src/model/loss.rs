//! A language model's loss, a chunk of tokens at a time: the cross-entropy of the output
//! layer's logits `hidden · weightᵀ` against each token's target (`transformers`' labels,
//! -100 left out), averaged over the targets that count.
//!
//! Autograd would keep the fp32 log-probabilities of every token of the micro-batch for
//! backward and make three more tensors of that size there (each 2.1 GB for 4,096 tokens of
//! Llama 3's 128,256-token vocabulary). Here forward and backward of the output layer run
//! together, chunk by chunk, the way fused linear-cross-entropy kernels do it; a chunk's
//! logits become their own gradient in place and are gone before the next chunk:
//!
//! ```text
//! z      = hidden · weightᵀ, in fp32              n = targets that are not -100
//! loss   = Σ (logsumexp(z) − z[target]) / n
//! ∂/∂z   = (softmax(z) − onehot(target)) · scale / n     (0 for a -100 target)
//! ∂/∂hidden = ∂/∂z · weight        ∂/∂weight = Σ over chunks (∂/∂z)ᵀ · hidden
//! ```
//!
//! `shardrun_models::loss` says how many tokens a chunk holds.

use tch::{Kind, Tensor};

/// `transformers`' label for a token that carries no loss.
const IGNORED: i64 = -100;

/// The mean loss of `hidden` (`(…, dim)`, in the compute dtype) under the output layer
/// `weight` (`(vocab, dim)`) against `targets` (`(…)`), as an fp32 scalar; 0 when every
/// target is -100. Without gradients (evaluation).
pub fn chunked_loss(hidden: &Tensor, weight: &Tensor, targets: &Tensor, chunk: i64) -> Tensor {
    tch::no_grad(|| run(hidden, weight, targets, chunk, None).0)
}

/// The mean loss as [`chunked_loss`], and the gradients of `scale · loss`: with respect to
/// `hidden` (returned, shaped like it) and to `weight`, handed to `weight_grad` one chunk's
/// share at a time (their sum is the gradient), so no more than a chunk's worth exists.
pub fn chunked_loss_and_grads(
    hidden: &Tensor,
    weight: &Tensor,
    targets: &Tensor,
    chunk: i64,
    scale: f64,
    weight_grad: &mut dyn FnMut(&Tensor),
) -> (Tensor, Tensor) {
    let (loss, grad_hidden) = tch::no_grad(|| {
        run(
            hidden,
            weight,
            targets,
            chunk,
            Some(Backward { scale, weight_grad }),
        )
    });
    let grad_hidden = grad_hidden.expect("gradients were asked for");
    (loss, grad_hidden)
}

/// What backward needs besides the chunk.
struct Backward<'a> {
    scale: f64,
    weight_grad: &'a mut dyn FnMut(&Tensor),
}

fn run(
    hidden: &Tensor,
    weight: &Tensor,
    targets: &Tensor,
    chunk: i64,
    mut backward: Option<Backward>,
) -> (Tensor, Option<Tensor>) {
    let dim = hidden.size()[hidden.dim() - 1];
    let flat_hidden = hidden.reshape([-1, dim]);
    let flat_targets = targets.reshape([-1]).to_device(hidden.device());
    let tokens = flat_hidden.size()[0];
    // Counted on the device: reading it on the host would wait for the forward so far.
    let counted = flat_targets.ne(IGNORED).sum(Kind::Float).clamp_min(1.0);
    let mut loss_sum = Tensor::zeros([], (Kind::Float, hidden.device()));
    let mut grad_pieces = Vec::new();
    let chunk = chunk.max(1);
    let mut start = 0;
    while start < tokens {
        let len = chunk.min(tokens - start);
        let h = flat_hidden.narrow(0, start, len);
        let t = flat_targets.narrow(0, start, len);
        let logits = h.linear::<Tensor>(weight, None).to_kind(Kind::Float);
        let kept = t.ne(IGNORED).to_kind(Kind::Float).unsqueeze(1);
        // A -100 target reads class 0, then counts for nothing.
        let target = t.clamp_min(0).unsqueeze(1);
        let picked = logits.gather(1, &target, false);
        // logsumexp(z) = max + log Σ exp(z − max), with exp(z − max) made in place of the
        // logits (`logsumexp` would make it beside them: twice a chunk's memory).
        let max = logits.amax([1], true);
        let mut exp = logits;
        let _ = exp.g_sub_(&max).exp_();
        let sum = exp.sum_dim_intlist([1i64].as_slice(), true, Kind::Float);
        loss_sum += ((sum.log() + max - picked) * &kept).sum(Kind::Float);
        if let Some(b) = backward.as_mut() {
            // softmax(z) in place, less one at the target, scaled.
            let mut grad = exp;
            let _ = grad.g_div_(&sum);
            let _ = grad.scatter_add_(1, &target, &(-&kept));
            let _ = grad.g_mul_(&(kept * counted.reciprocal() * b.scale));
            let grad = grad.to_kind(h.kind());
            grad_pieces.push(grad.mm(weight));
            (b.weight_grad)(&grad.tr().mm(&h));
        }
        start += len;
    }
    let loss = loss_sum / counted;
    let grad_hidden = backward.map(|_| {
        if grad_pieces.is_empty() {
            hidden.zeros_like()
        } else {
            Tensor::cat(&grad_pieces, 0).view(hidden.size().as_slice())
        }
    });
    (loss, grad_hidden)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    /// (hidden, weight, targets) of 2 rows of 5 tokens over a vocabulary of 7, with two
    /// targets left out.
    fn case(kind: Kind) -> (Tensor, Tensor, Tensor) {
        tch::manual_seed(3);
        let hidden = Tensor::randn([2, 5, 4], (Kind::Float, Device::Cpu)).to_kind(kind);
        let weight = Tensor::randn([7, 4], (Kind::Float, Device::Cpu)).to_kind(kind);
        let targets = Tensor::from_slice(&[3i64, 0, 6, -100, 2, 5, -100, 1, 1, 4]).view([2, 5]);
        (hidden, weight, targets)
    }

    /// PyTorch's own: autograd through `cross_entropy` on the whole batch's logits.
    fn autograd(hidden: &Tensor, weight: &Tensor, targets: &Tensor, scale: f64) -> [Tensor; 3] {
        let hidden = hidden.detach().set_requires_grad(true);
        let weight = weight.detach().set_requires_grad(true);
        let loss = hidden
            .linear::<Tensor>(&weight, None)
            .to_kind(Kind::Float)
            .reshape([-1, 7])
            .cross_entropy_loss::<Tensor>(
                &targets.reshape([-1]),
                None,
                tch::Reduction::Mean,
                IGNORED,
                0.0,
            );
        (&loss * scale).backward();
        [loss, hidden.grad(), weight.grad()]
    }

    fn max_difference(a: &Tensor, b: &Tensor) -> f64 {
        let d = (a.to_kind(Kind::Double) - b.to_kind(Kind::Double))
            .abs()
            .max()
            .double_value(&[]);
        assert!(d.is_finite(), "a difference of {d}");
        d
    }

    /// Every chunk size, the whole batch at once included, gives PyTorch's loss and
    /// gradients.
    #[test]
    fn loss_and_gradients_equal_autograds_at_every_chunk_size() {
        let (hidden, weight, targets) = case(Kind::Float);
        let [loss, grad_hidden, grad_weight] = autograd(&hidden, &weight, &targets, 3.0);
        for chunk in [1, 3, 4, 10, 64] {
            let mut summed = weight.zeros_like();
            let (ours, ours_hidden) =
                chunked_loss_and_grads(&hidden, &weight, &targets, chunk, 3.0, &mut |g| {
                    summed += g
                });
            assert!(max_difference(&ours, &loss) < 1e-6, "loss, chunk {chunk}");
            assert_eq!(ours_hidden.size(), hidden.size());
            assert!(
                max_difference(&ours_hidden, &grad_hidden) < 1e-6,
                "chunk {chunk}"
            );
            assert!(
                max_difference(&summed, &grad_weight) < 1e-6,
                "chunk {chunk}"
            );
            let eval = chunked_loss(&hidden, &weight, &targets, chunk);
            assert!(
                max_difference(&eval, &loss) < 1e-6,
                "evaluation, chunk {chunk}"
            );
        }
    }

    /// bf16 compute: the logits are cast up before the softmax, the gradient back down
    /// before the products, as autograd does.
    #[test]
    fn bf16_compute_equals_autograd_in_bf16() {
        let (hidden, weight, targets) = case(Kind::BFloat16);
        let [loss, grad_hidden, grad_weight] = autograd(&hidden, &weight, &targets, 1.0);
        let mut summed = Tensor::zeros([7, 4], (Kind::Float, Device::Cpu));
        let (ours, ours_hidden) =
            chunked_loss_and_grads(&hidden, &weight, &targets, 10, 1.0, &mut |g| {
                assert_eq!(g.kind(), Kind::BFloat16);
                summed += g
            });
        assert_eq!(ours.kind(), Kind::Float);
        assert_eq!(ours_hidden.kind(), Kind::BFloat16);
        assert!(max_difference(&ours, &loss) < 1e-6);
        assert!(max_difference(&ours_hidden, &grad_hidden) < 1e-2);
        assert!(max_difference(&summed, &grad_weight) < 1e-2);
    }

    /// Nothing to learn from: loss 0, gradients 0 (not NaN from 0/0).
    #[test]
    fn every_target_left_out_gives_zero_loss_and_gradients() {
        let (hidden, weight, _) = case(Kind::Float);
        let targets = Tensor::full([2, 5], IGNORED, (Kind::Int64, Device::Cpu));
        let mut summed = weight.zeros_like();
        let (loss, grad_hidden) =
            chunked_loss_and_grads(&hidden, &weight, &targets, 3, 1.0, &mut |g| summed += g);
        assert_eq!(loss.double_value(&[]), 0.0);
        assert_eq!(grad_hidden.abs().max().double_value(&[]), 0.0);
        assert_eq!(summed.abs().max().double_value(&[]), 0.0);
    }
}
