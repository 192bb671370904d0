//! Horus reproduces GPUMemNet's published worked numbers; the analytic form counts its terms.

use estimators::analytic::{allocator_bytes, analytic, horus_bytes, Optimizer, Precision};
use estimators::features::{Features, Layer};
use simulator::profile::Profile;

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

fn fc(input: u64, hidden: &[u64], out: u64) -> (u64, u64) {
    // (activations per sample, parameters) of an MLP input → hidden... → out.
    let mut widths = vec![input];
    widths.extend_from_slice(hidden);
    widths.push(out);
    let a: u64 = widths[1..].iter().sum();
    let p: u64 = widths.windows(2).map(|w| w[0] * w[1] + w[1]).sum();
    (a, p)
}

#[test]
fn horus_reproduces_published_numbers() {
    // Reference §3: "GiB × 1000" is how the baseline prints "MB".
    let check = |hidden: &[u64], batch: u64, want_elements: Option<u128>, want_mb: f64, tol: f64| {
        let (a, p) = fc(784, hidden, 10);
        let b = horus_bytes(a, batch, p);
        if let Some(e) = want_elements {
            assert_eq!(b, 4 * e, "elements for {} hidden layers", hidden.len());
        }
        let mb = b as f64 / GIB * 1000.0;
        assert!((mb - want_mb).abs() <= tol, "{} layers: {mb} vs published {want_mb}", hidden.len());
    };
    // FC on MNIST 784→1→10, B = 32: 26,917 elements, 1.0027e-4 GiB.
    check(&[1], 32, Some(26_917), 1.0027e-4 * 1000.0, 0.0005);
    // One 5,000-neuron layer: 489 MB.
    check(&[5000], 32, None, 489.0, 0.5);
    // 101 layers of 5,000 neurons: 307,947 MB.
    check(&[5000; 101], 32, None, 307_947.0, 1.0);
}

#[test]
fn allocator_rounding() {
    let check = |b: u64, want: u64| assert_eq!(allocator_bytes(b), want, "{b}");
    check(1, 512);
    check(512, 512);
    check(1 << 20, 1 << 20);
    check((1 << 20) + 1, 2 << 20);
    check(5 << 20, 6 << 20);
}

/// A model of one layer, nothing else known.
fn one_layer(kind: &str, parameters: u64, activations: u64) -> Features {
    Features {
        total_parameters: parameters,
        total_activations: activations,
        batch_size: None,
        model: None,
        seq_len: None,
        input_shape: None,
        layers: vec![Layer { kind: kind.into(), activations, parameters }],
    }
}

fn profile() -> Profile {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../profiles/a100-40gb.toml");
    Profile::load(path.to_str().unwrap()).expect("profiles/a100-40gb.toml loads").0
}

#[test]
fn analytic_terms_by_optimizer_and_precision() {
    let f = one_layer("Linear", 1_000_000, 1000);
    let p = profile();
    let w = allocator_bytes(4_000_000);
    let check = |opt: Optimizer, prec: Precision, slots: u64, act: u64, amp: u64| {
        let e = analytic(&f, 64, opt, prec, &p);
        assert_eq!((e.weights, e.gradients, e.optimizer_state), (w, w, slots * w), "{opt:?}");
        assert_eq!(e.activations, allocator_bytes(act * 1000 * 64));
        assert_eq!(e.amp_weight_copies, amp);
        assert_eq!(
            e.reserved,
            e.weights + e.gradients + e.optimizer_state + e.activations + amp + p.cublas_workspace_bytes()
        );
        let libs = simulator::fit::Libraries::single(true, false, "features");
        assert_eq!(e.device, e.reserved + simulator::fit::outside(&p, "p", libs).total_bytes);
    };
    check(Optimizer::Adam, Precision::Fp32, 2, 4, 0);
    check(Optimizer::Sgd, Precision::Fp32, 0, 4, 0);
    check(Optimizer::SgdMomentum, Precision::Amp, 1, 2, allocator_bytes(2_000_000));
    assert!("lion".parse::<Optimizer>().unwrap_err().contains("lion"));
}

/// A bigger batch never gives a smaller need: the sums saturate (they wrapped, so batch 2^61
/// gave less than batch 1), and a saturated need is no size (`unbounded`).
#[test]
fn analytic_saturates_at_huge_batches() {
    let f = one_layer("Conv2d", 11_689_512, 2_000_000);
    let p = profile();
    let mut last = 0;
    for batch in [1, 8, 1_000_000_000_000, 1_000_000_000_000_000, 1 << 61, u64::MAX] {
        let e = analytic(&f, batch, Optimizer::Adam, Precision::Fp32, &p);
        assert!(e.device >= last, "batch {batch}: {} < {last}", e.device);
        last = e.device;
        assert_eq!(e.unbounded().is_some(), batch >= 1_000_000_000_000_000, "batch {batch}: {e:?}");
    }
    assert_eq!(allocator_bytes(u64::MAX - 3), u64::MAX);
}

/// A formula's figure past 2^64 B (or saturated at it) is no device figure.
#[test]
fn formula_figures_past_2_64_are_unbounded() {
    use estimators::analytic::bounded;
    for (bytes, want) in [(0u128, Some(0u64)), (1 << 40, Some(1 << 40)), (u64::MAX as u128, None), (1 << 70, None)] {
        assert_eq!(bounded(bytes), want, "{bytes}");
    }
}
