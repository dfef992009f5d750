//! Gemma 3's conventions on small inputs, without the model file (the real model against its
//! references is in `tests/models/gemma3.rs`).

use ndarray::{Array2, Array3};

use super::Gemma3Config;
use crate::llama::rope_neox;
use crate::llama::rope_table;

fn config() -> Gemma3Config {
    Gemma3Config {
        layers: 18,
        hidden: 640,
        heads: 4,
        kv_heads: 1,
        head_dim: 256,
        ffn: 2048,
        vocab: 262_144,
        context: 32_768,
        rope_base_global: 1e6,
        rope_base_sliding: 1e4,
        sliding_window: 512,
        sliding_pattern: 6,
        rms_eps: 1e-6,
    }
}

#[test]
fn every_sixth_layer_is_global_and_the_others_see_the_last_512_positions() {
    let c = config();
    let global: Vec<usize> = (0..18).filter(|&l| c.is_global(l)).collect();
    assert_eq!(global, [5, 11, 17]);
    assert_eq!((c.rope_base(5), c.rope_base(4)), (1e6, 1e4));
    // Query 511 still sees position 0 (512 positions, itself included); query 512 does not.
    assert_eq!((c.first_visible(0, 511), c.first_visible(0, 512)), (0, 1));
    assert_eq!(c.first_visible(4, 2000), 2000 - 511);
    assert_eq!(c.first_visible(5, 2000), 0);
}

#[test]
fn neox_rope_turns_channel_i_with_channel_i_plus_half() {
    let (cos, sin) = rope_table(0, 3, 8, 10_000.0);
    // Position 0 is the identity; channel 0's angle at position p is p radians.
    assert_eq!((cos[[0, 0]], sin[[0, 0]]), (1.0, 0.0));
    assert_eq!(sin[[2, 0]], libm::sin(2.0) as f32);
    let mut x = Array3::from_shape_fn((1, 3, 8), |(_, _, c)| if c == 0 { 1.0 } else { 0.0 });
    rope_neox(&mut x, &cos, &sin);
    // (x_0, x_4) = (1, 0) turns to (cos p, sin p); every other channel stays 0.
    for p in 0..3 {
        assert_eq!((x[[0, p, 0]], x[[0, p, 4]]), (cos[[p, 0]], sin[[p, 0]]));
        assert!((1..8).filter(|&c| c != 4).all(|c| x[[0, p, c]] == 0.0));
    }
    // The last pair (3, 7) turns slowest: base^(-6/8) radians per position.
    let slow: Array2<f32> = cos.slice(ndarray::s![.., 3..4]).to_owned();
    assert_eq!(slow[[1, 0]], libm::cos(libm::pow(1e4, -0.75)) as f32);
}
