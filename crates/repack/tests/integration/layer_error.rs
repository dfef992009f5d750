//! `repack layer-error` on the real all-MiniLM-L6-v2 (fetched by `scripts/fetch-models` on first
//! use): every format's error is finite, 8-bit beats 4-bit on every matrix, and the bits per
//! weight are what `weights::bpw` computes for each layout from the shape alone.

use std::process::{Command, Output};
use std::sync::OnceLock;

use bitpack::{Bits, GroupAxis};
use models::bert::{Linear, MiniLm};
use models::{ModelName, files};
use repack::layer_error::{self, LayerErrorReport, REFERENCE_TEXT, Scheme};
use weights::bpw::{self, Container, Cost, FloatDtype, Format, ZeroPoints};

fn report() -> &'static LayerErrorReport {
    static REPORT: OnceLock<LayerErrorReport> = OnceLock::new();
    REPORT.get_or_init(|| {
        let files = files::locate_or_fetch(ModelName::MiniLm).unwrap();
        let model = MiniLm::load(&files).unwrap();
        layer_error::measure(&model, None, REFERENCE_TEXT).unwrap()
    })
}

/// The layout as `weights::bpw` describes it, for a PyTorch weight [out, in].
fn expected_cost(scheme: Scheme, out: usize, inputs: usize) -> Cost {
    let bits = Bits::new(scheme.bits()).unwrap();
    let (format, rows, cols) = match scheme {
        // [K = in, N = out], groups down K, qweight and qzeros in u32 words.
        Scheme::Gptq { .. } => (
            Format {
                zero_points: ZeroPoints::Packed,
                g_idx: true,
                container: Container::LineWords,
                ..Format::new(bits, 128, FloatDtype::F16)
            },
            inputs,
            out,
        ),
        Scheme::Awq => (
            Format {
                zero_points: ZeroPoints::Packed,
                ..Format::new(bits, 128, FloatDtype::F16)
            },
            inputs,
            out,
        ),
        // Blocks along each row of [out, in].
        Scheme::Q4_0 | Scheme::Q8_0 => (
            Format {
                axis: GroupAxis::Feature,
                ..Format::new(bits, 32, FloatDtype::F16)
            },
            out,
            inputs,
        ),
        Scheme::Q4_1 => (
            Format {
                axis: GroupAxis::Feature,
                zero_points: ZeroPoints::Float(FloatDtype::F16),
                ..Format::new(bits, 32, FloatDtype::F16)
            },
            out,
            inputs,
        ),
        Scheme::Nf4 => (
            Format {
                axis: GroupAxis::Feature,
                ..Format::new(bits, 64, FloatDtype::F32)
            },
            out,
            inputs,
        ),
    };
    bpw::cost(&format, rows, cols).unwrap()
}

#[test]
fn every_format_on_every_real_matrix_is_finite_and_eight_bits_beat_four() {
    let report = report();
    assert_eq!(report.layers, (0..6).collect::<Vec<_>>());
    assert_eq!(report.tokens, 12);
    assert_eq!(report.measurements.len(), 6 * 6 * Scheme::ALL.len());
    for layer in 0..6 {
        for linear in Linear::ALL {
            let error = |scheme: Scheme| {
                report
                    .measurements
                    .iter()
                    .find(|m| m.layer == layer && m.linear == linear && m.scheme == scheme)
                    .unwrap()
                    .relative_error
            };
            let what = format!("layer {layer} {}", linear.name());
            for scheme in Scheme::ALL {
                let e = error(scheme);
                assert!(e.is_finite() && e > 0.0, "{what} {scheme}: {e}");
            }
            let q8 = error(Scheme::Q8_0);
            assert!(q8 < 0.01, "{what}: Q8_0 {q8}");
            for eight in [Scheme::Q8_0, Scheme::Gptq { bits: 8 }] {
                for four in Scheme::ALL.into_iter().filter(|s| s.bits() == 4) {
                    assert!(
                        error(eight) < error(four),
                        "{what}: {eight} {} vs {four} {}",
                        error(eight),
                        error(four)
                    );
                }
            }
        }
    }
}

#[test]
fn bits_per_weight_are_what_weights_bpw_computes_for_each_layout() {
    let report = report();
    for m in &report.measurements {
        // MiniLM: hidden 384, intermediate 1536.
        let (out, inputs) = match m.linear {
            Linear::Intermediate => (1536, 384),
            Linear::Output => (384, 1536),
            _ => (384, 384),
        };
        assert_eq!(
            m.cost,
            expected_cost(m.scheme, out, inputs),
            "layer {} {} {}",
            m.layer,
            m.linear.name(),
            m.scheme
        );
    }
    let q8 = report.summary(Scheme::Q8_0, |_| true).unwrap();
    assert_eq!(q8.bits_per_weight, 8.5);
    let q4 = report.summary(Scheme::Q4_0, |_| true).unwrap();
    assert_eq!(q4.bits_per_weight, 4.5);
}

fn repack(args: &[&str], cache: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_repack"))
        .args(args)
        .env("KVPACK_MODELS", cache)
        .output()
        .expect("repack starts")
}

#[test]
fn the_command_prints_the_same_tables_every_run_and_refuses_a_missing_model_or_layer() {
    let files = files::locate_or_fetch(ModelName::MiniLm).unwrap();
    let cache = files.folder.parent().unwrap().to_str().unwrap().to_string();
    let args = ["layer-error", "--layers", "5,0"];
    let first = repack(&args, &cache);
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let text = String::from_utf8(first.stdout.clone()).unwrap();
    assert!(
        text.contains("layers 0,5 x 6 linear layers = 12 matrices"),
        "{text}"
    );
    assert!(text.contains("(12 tokens)"), "{text}");
    assert!(text.contains("bias excluded"), "{text}");
    assert!(text.contains("round-to-nearest"), "{text}");
    assert!(
        text.contains("| format | bits/weight | mean rel. error | max rel. error |"),
        "{text}"
    );
    for scheme in Scheme::ALL {
        let row = format!("| {} | ", scheme.label());
        assert_eq!(text.matches(&row).count(), 2, "{row} in\n{text}");
    }
    assert!(text.contains("| GGUF Q8_0 (block 32) | 8.500 | "), "{text}");
    assert_eq!(repack(&args, &cache).stdout, first.stdout);

    let missing = repack(&["layer-error", "--layers", "6"], &cache);
    assert!(!missing.status.success());
    let err = String::from_utf8_lossy(&missing.stderr);
    assert!(err.contains("layer 6 does not exist"), "{err}");

    let empty = tempfile::tempdir().unwrap();
    let missing = repack(&["layer-error"], empty.path().to_str().unwrap());
    assert!(!missing.status.success());
    let err = String::from_utf8_lossy(&missing.stderr);
    assert!(err.contains("scripts/fetch-models"), "{err}");
}
