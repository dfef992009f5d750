//! Times SmolLM2's load and forward passes of 5 and 512 tokens (`cargo run --release -p models
//! --example smollm2_timing`; needs `scripts/fetch-models`).

use std::time::Instant;

use models::llama;
use models::{ModelName, files};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = files::locate_or_fetch(ModelName::SmolLm2)?;
    let start = Instant::now();
    let (model, bpe) = llama::load_with_tokenizer(&files)?;
    println!("load (read, parse, dequantize): {:.2?}", start.elapsed());
    let ids = bpe.encode("The capital of France is")?;
    // 512 tokens: the ids of a repeated sentence, cut to length.
    let long: Vec<u32> = bpe
        .encode(&"A KV cache keeps the keys and values of every earlier token. ".repeat(60))?
        .into_iter()
        .take(512)
        .collect();
    for ids in [&ids, &long] {
        let start = Instant::now();
        model.forward(ids)?;
        println!("forward of {} tokens: {:.2?}", ids.len(), start.elapsed());
    }
    let start = Instant::now();
    model.generate_greedy(&ids, 8)?;
    println!("greedy, 8 tokens after 5: {:.2?}", start.elapsed());
    Ok(())
}
