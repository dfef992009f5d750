//! A BERT encoder's forward pass (post-LN, exact GELU, absolute positions), and
//! all-MiniLM-L6-v2 on top of it: [`MiniLm`] loads the fetched files and runs a text.
//!
//! One layer, for x [tokens, hidden]:
//! q, k, v = x Wq^T + bq, x Wk^T + bk, x Wv^T + bv, split into heads (head h = features
//! `h*d..(h+1)*d`); per head softmax(q k^T / sqrt(d)) v with no mask (one unpadded sequence);
//! x = LN(x + (attn Wo^T + bo)); x = LN(x + (gelu(x Wi^T + bi) Wout^T + bout)).
//! The input is LN(word + position + token type 0); [`Capture::hidden`] is the last layer's
//! output.

use std::path::PathBuf;

use ndarray::{Array2, Array3, ArrayView2, Axis};
use rayon::prelude::*;
use safetensors::{Dtype, SafeTensors};
use serde::Deserialize;
use thiserror::Error;

use crate::capture::{Capture, LayerCapture};
use crate::files::{FilesError, ModelFiles, ModelName};
use crate::ops;
use crate::tokenizer::wordpiece::{TokenizerError, WordPiece};

/// Why a BERT model cannot be loaded or run.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ModelError {
    /// The model's files are missing or wrong.
    #[error(transparent)]
    Files(#[from] FilesError),
    /// The files are another model's.
    #[error("{0} is not a BERT model; expected minilm's files")]
    WrongModel(ModelName),
    /// Reading a file failed.
    #[error("cannot read {}: {source}", .path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// `config.json` is not valid JSON or lacks a field.
    #[error("config.json: {0}")]
    ConfigJson(#[from] serde_json::Error),
    /// `config.json` describes a model this code does not run.
    #[error("config.json: {0}")]
    Config(String),
    /// The weight file is not a valid safetensors file (bad header, offsets past the end).
    #[error("the weights are not a valid safetensors file: {0}")]
    Safetensors(#[from] safetensors::SafeTensorError),
    /// A tensor the model needs is not in the weight file.
    #[error("tensor {0} is missing from the weights")]
    MissingTensor(String),
    /// A tensor is stored in another type than F32.
    #[error("tensor {name} is {dtype}, expected F32")]
    WrongDtype {
        /// The tensor.
        name: String,
        /// Its type in the file.
        dtype: String,
    },
    /// A tensor's shape does not fit `config.json`.
    #[error("tensor {name} has shape {found:?}, expected {expected:?} from the config")]
    WrongShape {
        /// The tensor.
        name: String,
        /// The shape the config implies.
        expected: Vec<usize>,
        /// The shape in the file.
        found: Vec<usize>,
    },
    /// The vocabulary cannot be read.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// The vocabulary and the embedding table disagree on the number of tokens.
    #[error("vocab.txt has {vocab} tokens, the model {model}")]
    VocabMismatch {
        /// Tokens in vocab.txt.
        vocab: usize,
        /// Rows of the word embedding.
        model: usize,
    },
    /// No token to run.
    #[error("no tokens to run")]
    Empty,
    /// More tokens than there are position embeddings.
    #[error("{tokens} tokens, the model takes at most {max}")]
    TooManyTokens {
        /// Tokens given.
        tokens: usize,
        /// `max_position_embeddings`.
        max: usize,
    },
    /// A token id past the end of the vocabulary.
    #[error("token {position} has id {id}, the vocabulary has {vocab_size} tokens")]
    IdOutOfRange {
        /// Where in the input.
        position: usize,
        /// The id.
        id: u32,
        /// `vocab_size`.
        vocab_size: usize,
    },
}

/// The hyperparameters of a BERT model, as `config.json` names them.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct BertConfig {
    /// Rows of the word embedding.
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Encoder layers.
    pub num_hidden_layers: usize,
    /// Attention heads; each is `hidden_size / num_attention_heads` wide.
    pub num_attention_heads: usize,
    /// Width of the feed-forward layer.
    pub intermediate_size: usize,
    /// Longest input, in tokens.
    pub max_position_embeddings: usize,
    /// Rows of the token-type embedding (only type 0 is used).
    pub type_vocab_size: usize,
    /// LayerNorm epsilon.
    pub layer_norm_eps: f64,
    /// Activation: only `gelu` (exact) is run.
    pub hidden_act: String,
    /// Only `absolute` is run; absent means absolute.
    #[serde(default)]
    pub position_embedding_type: Option<String>,
}

impl BertConfig {
    /// Parses `config.json` and checks that it describes a model this code runs.
    pub fn from_json(text: &str) -> Result<BertConfig, ModelError> {
        let config: BertConfig = serde_json::from_str(text)?;
        config.validate()?;
        Ok(config)
    }

    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads
    }

    fn validate(&self) -> Result<(), ModelError> {
        let bad = |why: String| Err(ModelError::Config(why));
        if self.hidden_act != "gelu" {
            return bad(format!(
                "hidden_act {:?}, only \"gelu\" is run",
                self.hidden_act
            ));
        }
        if let Some(kind) = &self.position_embedding_type
            && kind != "absolute"
        {
            return bad(format!(
                "position_embedding_type {kind:?}, only \"absolute\" is run"
            ));
        }
        for (name, value) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("num_attention_heads", self.num_attention_heads),
            ("intermediate_size", self.intermediate_size),
            ("max_position_embeddings", self.max_position_embeddings),
            ("type_vocab_size", self.type_vocab_size),
        ] {
            if value == 0 {
                return bad(format!("{name} is 0"));
            }
        }
        if !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return bad(format!(
                "hidden_size {} is not a multiple of num_attention_heads {}",
                self.hidden_size, self.num_attention_heads
            ));
        }
        if !(self.layer_norm_eps.is_finite() && self.layer_norm_eps >= 0.0) {
            return bad(format!("layer_norm_eps {}", self.layer_norm_eps));
        }
        Ok(())
    }
}

/// One encoder layer's weights; matrices are [out, in].
#[derive(Debug, Clone)]
struct Layer {
    query: (Array2<f32>, Vec<f32>),
    key: (Array2<f32>, Vec<f32>),
    value: (Array2<f32>, Vec<f32>),
    attention_out: (Array2<f32>, Vec<f32>),
    attention_norm: (Vec<f32>, Vec<f32>),
    intermediate: (Array2<f32>, Vec<f32>),
    output: (Array2<f32>, Vec<f32>),
    output_norm: (Vec<f32>, Vec<f32>),
}

/// The six linear layers of a BERT encoder layer, in the order the forward pass runs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Linear {
    /// `attention.self.query`: input the hidden state entering the layer.
    Query,
    /// `attention.self.key`: the same input as the query.
    Key,
    /// `attention.self.value`: the same input as the query.
    Value,
    /// `attention.output.dense`: input the attention context (heads concatenated).
    AttentionOutput,
    /// `intermediate.dense` (FFN up): input the stream after the attention LayerNorm.
    Intermediate,
    /// `output.dense` (FFN down): input the intermediate activations after GELU.
    Output,
}

impl Linear {
    /// All six, in forward order.
    pub const ALL: [Linear; 6] = [
        Linear::Query,
        Linear::Key,
        Linear::Value,
        Linear::AttentionOutput,
        Linear::Intermediate,
        Linear::Output,
    ];

    /// The PyTorch name under `encoder.layer.{L}.`, without `.weight`.
    pub fn name(self) -> &'static str {
        match self {
            Linear::Query => "attention.self.query",
            Linear::Key => "attention.self.key",
            Linear::Value => "attention.self.value",
            Linear::AttentionOutput => "attention.output.dense",
            Linear::Intermediate => "intermediate.dense",
            Linear::Output => "output.dense",
        }
    }
}

impl Layer {
    fn linear(&self, linear: Linear) -> &(Array2<f32>, Vec<f32>) {
        match linear {
            Linear::Query => &self.query,
            Linear::Key => &self.key,
            Linear::Value => &self.value,
            Linear::AttentionOutput => &self.attention_out,
            Linear::Intermediate => &self.intermediate,
            Linear::Output => &self.output,
        }
    }
}

/// A BERT encoder with its weights in memory.
#[derive(Debug, Clone)]
pub struct Bert {
    config: BertConfig,
    word: Array2<f32>,
    position: Array2<f32>,
    token_type: Array2<f32>,
    embedding_norm: (Vec<f32>, Vec<f32>),
    layers: Vec<Layer>,
}

/// Reads F32 tensors by name, checking each one's type and shape before copying it.
struct Tensors<'a>(SafeTensors<'a>);

impl Tensors<'_> {
    fn get(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, ModelError> {
        let view = self
            .0
            .tensor(name)
            .map_err(|_| ModelError::MissingTensor(name.to_string()))?;
        if view.dtype() != Dtype::F32 {
            return Err(ModelError::WrongDtype {
                name: name.to_string(),
                dtype: view.dtype().to_string(),
            });
        }
        if view.shape() != shape {
            return Err(ModelError::WrongShape {
                name: name.to_string(),
                expected: shape.to_vec(),
                found: view.shape().to_vec(),
            });
        }
        // The safetensors reader has checked that the data is dtype size x shape bytes, inside
        // the buffer.
        Ok(view
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect())
    }

    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Array2<f32>, ModelError> {
        let data = self.get(name, &[rows, cols])?;
        Ok(Array2::from_shape_vec((rows, cols), data).expect("length checked against the shape"))
    }

    fn linear(
        &self,
        prefix: &str,
        outputs: usize,
        inputs: usize,
    ) -> Result<(Array2<f32>, Vec<f32>), ModelError> {
        Ok((
            self.matrix(&format!("{prefix}.weight"), outputs, inputs)?,
            self.get(&format!("{prefix}.bias"), &[outputs])?,
        ))
    }

    fn norm(&self, prefix: &str, width: usize) -> Result<(Vec<f32>, Vec<f32>), ModelError> {
        Ok((
            self.get(&format!("{prefix}.weight"), &[width])?,
            self.get(&format!("{prefix}.bias"), &[width])?,
        ))
    }
}

impl Bert {
    /// Builds the model from the bytes of a safetensors file holding BERT's tensors under
    /// their PyTorch names (`embeddings.word_embeddings.weight`,
    /// `encoder.layer.{L}.attention.self.query.weight`, ...). Other tensors (the pooler,
    /// `embeddings.position_ids`) are ignored.
    pub fn from_safetensors(config: BertConfig, bytes: &[u8]) -> Result<Bert, ModelError> {
        config.validate()?;
        let t = Tensors(SafeTensors::deserialize(bytes)?);
        let h = config.hidden_size;
        let ffn = config.intermediate_size;
        let mut layers = Vec::with_capacity(config.num_hidden_layers.min(1024));
        for l in 0..config.num_hidden_layers {
            let p = format!("encoder.layer.{l}");
            layers.push(Layer {
                query: t.linear(&format!("{p}.attention.self.query"), h, h)?,
                key: t.linear(&format!("{p}.attention.self.key"), h, h)?,
                value: t.linear(&format!("{p}.attention.self.value"), h, h)?,
                attention_out: t.linear(&format!("{p}.attention.output.dense"), h, h)?,
                attention_norm: t.norm(&format!("{p}.attention.output.LayerNorm"), h)?,
                intermediate: t.linear(&format!("{p}.intermediate.dense"), ffn, h)?,
                output: t.linear(&format!("{p}.output.dense"), h, ffn)?,
                output_norm: t.norm(&format!("{p}.output.LayerNorm"), h)?,
            });
        }
        Ok(Bert {
            word: t.matrix("embeddings.word_embeddings.weight", config.vocab_size, h)?,
            position: t.matrix(
                "embeddings.position_embeddings.weight",
                config.max_position_embeddings,
                h,
            )?,
            token_type: t.matrix(
                "embeddings.token_type_embeddings.weight",
                config.type_vocab_size,
                h,
            )?,
            embedding_norm: t.norm("embeddings.LayerNorm", h)?,
            layers,
            config,
        })
    }

    /// The hyperparameters.
    pub fn config(&self) -> &BertConfig {
        &self.config
    }

    /// Runs the encoder over `ids` (token type 0, positions from 0, every token attending to
    /// every token) and returns each layer's q, k, v [heads, tokens, head_dim] and the last
    /// layer's output as [`Capture::hidden`]; `logits` is `None`.
    pub fn forward(&self, ids: &[u32]) -> Result<Capture, ModelError> {
        self.forward_with(ids, |_, _, _| {})
    }

    /// One layer's linear weight [out, in] and bias, or `None` past the last layer.
    pub fn linear(&self, layer: usize, linear: Linear) -> Option<(ArrayView2<'_, f32>, &[f32])> {
        let (w, b) = self.layers.get(layer)?.linear(linear);
        Some((w.view(), b))
    }

    /// [`Self::forward`], handing `observe` the input [tokens, in] of every linear layer as it
    /// runs: `observe(layer, linear, x)`, in forward order (query, key and value get the same
    /// x). Observing changes nothing: the capture is bit-identical to [`Self::forward`]'s.
    pub fn forward_with(
        &self,
        ids: &[u32],
        mut observe: impl FnMut(usize, Linear, ArrayView2<f32>),
    ) -> Result<Capture, ModelError> {
        let c = &self.config;
        if ids.is_empty() {
            return Err(ModelError::Empty);
        }
        if ids.len() > c.max_position_embeddings {
            return Err(ModelError::TooManyTokens {
                tokens: ids.len(),
                max: c.max_position_embeddings,
            });
        }
        if let Some((position, &id)) = ids
            .iter()
            .enumerate()
            .find(|&(_, &id)| id as usize >= c.vocab_size)
        {
            return Err(ModelError::IdOutOfRange {
                position,
                id,
                vocab_size: c.vocab_size,
            });
        }
        let eps = c.layer_norm_eps as f32;
        let mut x = Array2::<f32>::zeros((ids.len(), c.hidden_size));
        for (t, (mut row, &id)) in x.axis_iter_mut(Axis(0)).zip(ids).enumerate() {
            let parts = [
                self.word.row(id as usize),
                self.position.row(t),
                self.token_type.row(0),
            ];
            for (j, v) in row.iter_mut().enumerate() {
                *v = (parts[0][j] + parts[1][j]) + parts[2][j];
            }
        }
        ops::layer_norm(&mut x, &self.embedding_norm.0, &self.embedding_norm.1, eps);

        let heads = c.num_attention_heads;
        let mut captured = Vec::with_capacity(self.layers.len());
        for (l, layer) in self.layers.iter().enumerate() {
            for linear in [Linear::Query, Linear::Key, Linear::Value] {
                observe(l, linear, x.view());
            }
            let project = |(w, b): &(Array2<f32>, Vec<f32>)| {
                split_heads(ops::linear(x.view(), w.view(), Some(b)).view(), heads)
            };
            let (q, k, v) = (
                project(&layer.query),
                project(&layer.key),
                project(&layer.value),
            );
            let context = attention(&q, &k, &v);
            observe(l, Linear::AttentionOutput, context.view());
            let out = ops::linear(
                context.view(),
                layer.attention_out.0.view(),
                Some(&layer.attention_out.1),
            );
            x += &out;
            ops::layer_norm(
                &mut x,
                &layer.attention_norm.0,
                &layer.attention_norm.1,
                eps,
            );

            observe(l, Linear::Intermediate, x.view());
            let mut inner = ops::linear(
                x.view(),
                layer.intermediate.0.view(),
                Some(&layer.intermediate.1),
            );
            inner.mapv_inplace(ops::gelu);
            observe(l, Linear::Output, inner.view());
            let out = ops::linear(inner.view(), layer.output.0.view(), Some(&layer.output.1));
            x += &out;
            ops::layer_norm(&mut x, &layer.output_norm.0, &layer.output_norm.1, eps);
            captured.push(LayerCapture { q, k, v });
        }
        Ok(Capture {
            ids: ids.to_vec(),
            layers: captured,
            hidden: x,
            logits: None,
        })
    }
}

/// [tokens, heads * d] -> [heads, tokens, d]: head h takes features `h*d..(h+1)*d`.
fn split_heads(x: ArrayView2<f32>, heads: usize) -> Array3<f32> {
    let (tokens, width) = x.dim();
    let d = width / heads;
    Array3::from_shape_fn((heads, tokens, d), |(h, t, j)| x[[t, h * d + j]])
}

/// Head `h` of a [heads, tokens, d] array as one slice (the arrays here are built in standard
/// layout, where a head is contiguous).
fn head(a: &Array3<f32>, h: usize) -> &[f32] {
    a.index_axis(Axis(0), h)
        .to_slice()
        .expect("built in standard layout")
}

/// Unmasked multi-head attention: q, k, v [heads, tokens, d] -> [tokens, heads * d].
/// The 1/sqrt(d) scale divides each score after its dot product, as BERT does. Heads run on
/// rayon's threads; each one's arithmetic is the same on any thread count.
fn attention(q: &Array3<f32>, k: &Array3<f32>, v: &Array3<f32>) -> Array2<f32> {
    let (heads, tokens, d) = q.dim();
    let scale = (d as f32).sqrt();
    let per_head: Vec<Vec<f32>> = (0..heads)
        .into_par_iter()
        .map(|h| {
            let (q, k, v) = (head(q, h), head(k, h), head(v, h));
            let mut out = vec![0f32; tokens * d];
            let mut scores = vec![0f32; tokens];
            for (qt, row) in q.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
                for (score, ks) in scores.iter_mut().zip(k.chunks_exact(d)) {
                    *score = ops::dot(qt, ks) / scale;
                }
                ops::softmax_in_place(&mut scores);
                // Weighted sum of the values, in token order.
                for (&p, vs) in scores.iter().zip(v.chunks_exact(d)) {
                    for (o, &value) in row.iter_mut().zip(vs) {
                        *o += p * value;
                    }
                }
            }
            out
        })
        .collect();
    let mut context = Array2::<f32>::zeros((tokens, heads * d));
    for (h, part) in per_head.iter().enumerate() {
        for (t, row) in part.chunks_exact(d).enumerate() {
            for (j, &value) in row.iter().enumerate() {
                context[[t, h * d + j]] = value;
            }
        }
    }
    context
}

/// The sentence embedding all-MiniLM-L6-v2 is trained for: the mean of [`Capture::hidden`]
/// over all tokens (`[CLS]` and `[SEP]` included), then scaled to unit L2 norm. Sums in token
/// order.
pub fn embedding(capture: &Capture) -> Vec<f32> {
    let tokens = capture.hidden.nrows();
    let mut mean = vec![0f32; capture.hidden.ncols()];
    for row in capture.hidden.rows() {
        for (m, &v) in mean.iter_mut().zip(row) {
            *m += v;
        }
    }
    for m in &mut mean {
        *m /= tokens as f32;
    }
    let norm = mean.iter().fold(0f32, |s, &v| s + v * v).sqrt();
    if norm > 0.0 {
        for m in &mut mean {
            *m /= norm;
        }
    }
    mean
}

/// all-MiniLM-L6-v2: its encoder and its WordPiece tokenizer.
#[derive(Debug, Clone)]
pub struct MiniLm {
    bert: Bert,
    tokenizer: WordPiece,
}

impl MiniLm {
    /// Loads `config.json`, `model.safetensors` and `vocab.txt` from the model's folder.
    pub fn load(files: &ModelFiles) -> Result<MiniLm, ModelError> {
        if files.model != ModelName::MiniLm {
            return Err(ModelError::WrongModel(files.model));
        }
        let read = |name: &str| {
            let path = files.path(name);
            std::fs::read(&path).map_err(|source| ModelError::Io { path, source })
        };
        let vocab = read("vocab.txt")?;
        MiniLm::from_bytes(
            &read("config.json")?,
            &read(ModelName::MiniLm.weight_file())?,
            &vocab,
        )
    }

    /// The model from the bytes of `config.json`, `model.safetensors` and `vocab.txt`: for a
    /// caller that hashes exactly the bytes it parses (the audit).
    pub fn from_bytes(config: &[u8], weights: &[u8], vocab: &[u8]) -> Result<MiniLm, ModelError> {
        let config = BertConfig::from_json(&String::from_utf8_lossy(config))?;
        let bert = Bert::from_safetensors(config, weights)?;
        let tokenizer = WordPiece::from_vocab(&String::from_utf8_lossy(vocab))?;
        if tokenizer.vocab_size() != bert.config.vocab_size {
            return Err(ModelError::VocabMismatch {
                vocab: tokenizer.vocab_size(),
                model: bert.config.vocab_size,
            });
        }
        Ok(MiniLm { bert, tokenizer })
    }

    /// The encoder.
    pub fn bert(&self) -> &Bert {
        &self.bert
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &WordPiece {
        &self.tokenizer
    }

    /// [`Bert::forward`] on ids.
    pub fn forward(&self, ids: &[u32]) -> Result<Capture, ModelError> {
        self.bert.forward(ids)
    }

    /// Tokenizes `text` (`[CLS] ... [SEP]`, unpadded) and runs it.
    pub fn run(&self, text: &str) -> Result<Capture, ModelError> {
        self.forward(&self.tokenizer.encode(text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use safetensors::tensor::TensorView;

    /// 20 tokens, width 8, 2 heads of 4, feed-forward 16, at most 16 positions.
    fn tiny_config(layers: usize) -> BertConfig {
        BertConfig {
            vocab_size: 20,
            hidden_size: 8,
            num_hidden_layers: layers,
            num_attention_heads: 2,
            intermediate_size: 16,
            max_position_embeddings: 16,
            type_vocab_size: 2,
            layer_norm_eps: 1e-12,
            hidden_act: "gelu".into(),
            position_embedding_type: None,
        }
    }

    /// Every tensor BERT reads for `c`, with its shape.
    fn tensor_shapes(c: &BertConfig) -> Vec<(String, Vec<usize>)> {
        let (h, f) = (c.hidden_size, c.intermediate_size);
        let mut all = vec![
            (
                "embeddings.word_embeddings.weight".into(),
                vec![c.vocab_size, h],
            ),
            (
                "embeddings.position_embeddings.weight".into(),
                vec![c.max_position_embeddings, h],
            ),
            (
                "embeddings.token_type_embeddings.weight".into(),
                vec![c.type_vocab_size, h],
            ),
            ("embeddings.LayerNorm.weight".into(), vec![h]),
            ("embeddings.LayerNorm.bias".into(), vec![h]),
        ];
        for l in 0..c.num_hidden_layers {
            let p = format!("encoder.layer.{l}");
            for (name, shape) in [
                ("attention.self.query", [h, h]),
                ("attention.self.key", [h, h]),
                ("attention.self.value", [h, h]),
                ("attention.output.dense", [h, h]),
                ("intermediate.dense", [f, h]),
                ("output.dense", [h, f]),
            ] {
                all.push((format!("{p}.{name}.weight"), shape.to_vec()));
                all.push((format!("{p}.{name}.bias"), vec![shape[0]]));
            }
            for name in ["attention.output.LayerNorm", "output.LayerNorm"] {
                all.push((format!("{p}.{name}.weight"), vec![h]));
                all.push((format!("{p}.{name}.bias"), vec![h]));
            }
        }
        all
    }

    /// A safetensors file of `tensors`, element i of tensor `name` being `fill(name, i)`.
    fn write(tensors: &[(String, Vec<usize>)], fill: impl Fn(&str, usize) -> f32) -> Vec<u8> {
        let data: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
            .iter()
            .map(|(name, shape)| {
                let n: usize = shape.iter().product();
                let bytes = (0..n).flat_map(|i| fill(name, i).to_le_bytes()).collect();
                (name.clone(), shape.clone(), bytes)
            })
            .collect();
        let views = data.iter().map(|(name, shape, bytes)| {
            (
                name.as_str(),
                TensorView::new(Dtype::F32, shape.clone(), bytes).unwrap(),
            )
        });
        safetensors::serialize(views, None).unwrap()
    }

    /// Deterministic pseudo-random weights in [-0.5, 0.5], LayerNorm gains near 1.
    fn random(name: &str, i: usize) -> f32 {
        let seed = name
            .bytes()
            .fold(7u32, |h, b| h.wrapping_mul(31).wrapping_add(b as u32));
        let noise = ((seed as f32 * 0.001 + i as f32 * 0.7311).sin() * 0.5).clamp(-0.5, 0.5);
        if name.contains("LayerNorm.weight") {
            1.0 + noise * 0.2
        } else {
            noise
        }
    }

    fn tiny(layers: usize) -> Bert {
        let config = tiny_config(layers);
        Bert::from_safetensors(config.clone(), &write(&tensor_shapes(&config), random)).unwrap()
    }

    #[test]
    fn a_tiny_random_bert_gives_every_layers_heads_and_the_same_bits_on_any_thread_count() {
        let model = tiny(2);
        let ids = [1, 5, 19, 0, 7];
        let capture = model.forward(&ids).unwrap();
        assert_eq!(capture.ids, ids);
        assert_eq!(capture.layers.len(), 2);
        for layer in &capture.layers {
            for a in [&layer.q, &layer.k, &layer.v] {
                assert_eq!(a.dim(), (2, 5, 4));
                assert!(a.iter().all(|v| v.is_finite()));
            }
        }
        assert_eq!(capture.hidden.dim(), (5, 8));
        assert!(capture.logits.is_none());
        let one_thread = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap()
            .install(|| model.forward(&ids).unwrap());
        assert_eq!(one_thread, capture);
    }

    #[test]
    fn layer_0_queries_are_the_normalized_embeddings_times_wq_split_into_heads() {
        let model = tiny(1);
        let ids = [3, 4, 3];
        let capture = model.forward(&ids).unwrap();
        let mut x = Array2::from_shape_fn((3, 8), |(t, j)| {
            (model.word[[ids[t] as usize, j]] + model.position[[t, j]]) + model.token_type[[0, j]]
        });
        let (gamma, beta) = &model.embedding_norm;
        ops::layer_norm(&mut x, gamma, beta, 1e-12);
        let (w, b) = &model.layers[0].query;
        let q = ops::linear(x.view(), w.view(), Some(b));
        for h in 0..2 {
            for t in 0..3 {
                for j in 0..4 {
                    assert_eq!(capture.layers[0].q[[h, t, j]], q[[t, 4 * h + j]]);
                }
            }
        }
    }

    #[test]
    fn each_linear_layers_observed_input_times_its_weight_gives_what_the_pass_computed() {
        let model = tiny(2);
        let ids = [1, 5, 19, 0, 7];
        let mut inputs = Vec::new();
        let capture = model
            .forward_with(&ids, |l, linear, x| inputs.push((l, linear, x.to_owned())))
            .unwrap();
        // Observing changes no bit of the pass.
        assert_eq!(capture, model.forward(&ids).unwrap());
        let order: Vec<(usize, Linear)> = inputs.iter().map(|(l, lin, _)| (*l, *lin)).collect();
        let expected: Vec<(usize, Linear)> = (0..2)
            .flat_map(|l| Linear::ALL.map(|lin| (l, lin)))
            .collect();
        assert_eq!(order, expected);
        for (l, linear, x) in &inputs {
            let (w, b) = model.linear(*l, *linear).unwrap();
            assert_eq!(x.ncols(), w.ncols(), "layer {l} {}", linear.name());
            let y = ops::linear(x.view(), w, Some(b));
            let heads = split_heads(y.view(), 2);
            match linear {
                Linear::Query => assert_eq!(heads, capture.layers[*l].q),
                Linear::Key => assert_eq!(heads, capture.layers[*l].k),
                Linear::Value => assert_eq!(heads, capture.layers[*l].v),
                _ => {}
            }
        }
        // The FFN down input is GELU of the FFN up output.
        let up = &inputs[4].2;
        let (w, b) = model.linear(0, Linear::Intermediate).unwrap();
        let gelu = ops::linear(up.view(), w, Some(b)).mapv(ops::gelu);
        assert_eq!(gelu, inputs[5].2);
        assert!(model.linear(2, Linear::Query).is_none());
    }

    #[test]
    fn with_zero_queries_and_keys_attention_is_uniform_so_each_token_gets_the_mean_value() {
        // One layer: Q, K zero (all scores equal), V and the attention output the identity,
        // the feed-forward zero, LayerNorms plain. Then the layer computes
        // hidden[t] = LN(LN(x[t] + mean_s x[s])), and v = x.
        let config = tiny_config(1);
        let bytes = write(&tensor_shapes(&config), |name, i| {
            let identity = if i % 9 == 0 { 1.0 } else { 0.0 };
            match name {
                n if n.contains("query") || n.contains("key") => 0.0,
                n if n.contains("intermediate") || n.contains("output.dense") => {
                    if n.contains("attention.output.dense.weight") {
                        identity
                    } else {
                        0.0
                    }
                }
                n if n.contains("value.weight") => identity,
                n if n.contains("value.bias") => 0.0,
                n if n.contains("LayerNorm.weight") => 1.0,
                n if n.contains("LayerNorm.bias") => 0.0,
                n => random(n, i),
            }
        });
        let model = Bert::from_safetensors(config, &bytes).unwrap();
        let capture = model.forward(&[2, 9, 11, 4]).unwrap();
        let layer = &capture.layers[0];
        assert!(layer.q.iter().chain(&layer.k).all(|&v| v == 0.0));
        // x back from the heads of v.
        let x = Array2::from_shape_fn((4, 8), |(t, j)| layer.v[[j / 4, t, j % 4]]);
        let mean = x.mean_axis(Axis(0)).unwrap();
        let mut expected = &x + &mean;
        let (ones, zeros) = (vec![1.0; 8], vec![0.0; 8]);
        ops::layer_norm(&mut expected, &ones, &zeros, 1e-12);
        ops::layer_norm(&mut expected, &ones, &zeros, 1e-12);
        for (a, b) in capture.hidden.iter().zip(&expected) {
            assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        }
    }

    #[test]
    fn attention_follows_the_scores() {
        // One head, d = 1: token 0's query matches key 1 far better than key 0.
        let q = Array3::from_shape_vec((1, 2, 1), vec![100.0, 0.0]).unwrap();
        let k = Array3::from_shape_vec((1, 2, 1), vec![0.0, 1.0]).unwrap();
        let v = Array3::from_shape_vec((1, 2, 1), vec![3.0, 5.0]).unwrap();
        let out = attention(&q, &k, &v);
        assert_eq!(out[[0, 0]], 5.0);
        // Token 1's query is 0: both scores 0, the mean of the values.
        assert_eq!(out[[1, 0]], 4.0);
    }

    #[test]
    fn bad_ids_and_lengths_are_refused() {
        let model = tiny(1);
        assert!(matches!(model.forward(&[]), Err(ModelError::Empty)));
        assert!(matches!(
            model.forward(&[1, 20]),
            Err(ModelError::IdOutOfRange {
                position: 1,
                id: 20,
                vocab_size: 20
            })
        ));
        assert!(matches!(
            model.forward(&[1; 17]),
            Err(ModelError::TooManyTokens {
                tokens: 17,
                max: 16
            })
        ));
        assert!(model.forward(&[1; 16]).is_ok());
    }

    #[test]
    fn a_missing_mistyped_or_misshapen_tensor_is_named() {
        let config = tiny_config(2);
        let mut shapes = tensor_shapes(&config);
        let err = Bert::from_safetensors(config.clone(), &write(&shapes[1..], random)).unwrap_err();
        assert!(
            matches!(&err, ModelError::MissingTensor(n) if n == "embeddings.word_embeddings.weight"),
            "{err}"
        );

        let name = "encoder.layer.1.intermediate.dense.weight";
        let at = shapes.iter().position(|(n, _)| n == name).unwrap();
        shapes[at].1 = vec![16, 9];
        let err = Bert::from_safetensors(config.clone(), &write(&shapes, random)).unwrap_err();
        assert!(
            matches!(&err, ModelError::WrongShape { name: n, expected, found }
                if n == name && expected == &[16, 8] && found == &[16, 9]),
            "{err}"
        );
        assert!(err.to_string().contains(name), "{err}");

        // The same file with one tensor stored as F16.
        let shapes = tensor_shapes(&config);
        let half = vec![0u8; 2 * 8];
        let mut f32_data: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
        for (n, shape) in &shapes {
            let count: usize = shape.iter().product();
            f32_data.push((n.clone(), shape.clone(), vec![0u8; 4 * count]));
        }
        let views = f32_data.iter().map(|(n, shape, bytes)| {
            if n == "embeddings.LayerNorm.bias" {
                (
                    n.as_str(),
                    TensorView::new(Dtype::F16, vec![8], &half).unwrap(),
                )
            } else {
                (
                    n.as_str(),
                    TensorView::new(Dtype::F32, shape.clone(), bytes).unwrap(),
                )
            }
        });
        let bytes = safetensors::serialize(views, None).unwrap();
        let err = Bert::from_safetensors(config, &bytes).unwrap_err();
        assert!(
            matches!(&err, ModelError::WrongDtype { name, .. } if name == "embeddings.LayerNorm.bias"),
            "{err}"
        );
    }

    #[test]
    fn a_truncated_file_is_an_error_not_a_panic() {
        let config = tiny_config(1);
        let bytes = write(&tensor_shapes(&config), random);
        for cut in [0, 7, 8, 100, bytes.len() - 1] {
            let err = Bert::from_safetensors(config.clone(), &bytes[..cut]).unwrap_err();
            assert!(
                matches!(err, ModelError::Safetensors(_)),
                "cut {cut}: {err}"
            );
        }
    }

    #[test]
    fn a_config_this_code_does_not_run_is_refused() {
        let json = |act: &str, hidden: usize| {
            format!(
                r#"{{"vocab_size": 20, "hidden_size": {hidden}, "num_hidden_layers": 1,
                "num_attention_heads": 2, "intermediate_size": 16,
                "max_position_embeddings": 16, "type_vocab_size": 2,
                "layer_norm_eps": 1e-12, "hidden_act": "{act}"}}"#
            )
        };
        assert_eq!(
            BertConfig::from_json(&json("gelu", 8)).unwrap(),
            tiny_config(1)
        );
        let err = BertConfig::from_json(&json("relu", 8)).unwrap_err();
        assert!(err.to_string().contains("relu"), "{err}");
        let err = BertConfig::from_json(&json("gelu", 9)).unwrap_err();
        assert!(err.to_string().contains("multiple"), "{err}");
        assert!(matches!(
            BertConfig::from_json("{}"),
            Err(ModelError::ConfigJson(_))
        ));
    }

    #[test]
    fn the_embedding_is_the_unit_length_mean_of_the_last_hidden_rows() {
        let capture = Capture {
            ids: vec![0, 1],
            layers: vec![],
            hidden: ndarray::array![[1.0, 2.0], [5.0, 4.0]],
            logits: None,
        };
        // Mean (3, 3), norm 3 sqrt 2.
        let e = embedding(&capture);
        let expected = 1.0 / 2f32.sqrt();
        assert!(e.iter().all(|&v| (v - expected).abs() < 1e-7), "{e:?}");
    }

    #[test]
    fn minilm_loads_config_weights_and_vocabulary_from_its_folder() {
        let folder = tempfile::tempdir().unwrap();
        let config = r#"{"vocab_size": 20, "hidden_size": 8, "num_hidden_layers": 1,
            "num_attention_heads": 2, "intermediate_size": 16, "max_position_embeddings": 16,
            "type_vocab_size": 2, "layer_norm_eps": 1e-12, "hidden_act": "gelu",
            "position_embedding_type": "absolute", "model_type": "bert"}"#;
        std::fs::write(folder.path().join("config.json"), config).unwrap();
        let bytes = write(&tensor_shapes(&tiny_config(1)), random);
        std::fs::write(folder.path().join("model.safetensors"), bytes).unwrap();
        let mut vocab: Vec<String> = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "hello"]
            .map(String::from)
            .to_vec();
        vocab.extend((5..20).map(|i| format!("w{i}")));
        std::fs::write(folder.path().join("vocab.txt"), vocab.join("\n")).unwrap();
        // The hash is not checked here: only `ModelFiles::locate` checks it.
        let files = ModelFiles {
            model: ModelName::MiniLm,
            folder: folder.path().to_path_buf(),
            weight_sha256: String::new(),
        };
        let model = MiniLm::load(&files).unwrap();
        let capture = model.run("Hello").unwrap();
        assert_eq!(capture.ids, [2, 4, 3]);
        assert_eq!(capture, model.bert().forward(&[2, 4, 3]).unwrap());

        // A vocabulary one token short of the embedding table.
        std::fs::write(folder.path().join("vocab.txt"), vocab[..19].join("\n")).unwrap();
        assert!(matches!(
            MiniLm::load(&files),
            Err(ModelError::VocabMismatch {
                vocab: 19,
                model: 20
            })
        ));
        let smollm = ModelFiles {
            model: ModelName::SmolLm2,
            ..files
        };
        assert!(matches!(
            MiniLm::load(&smollm),
            Err(ModelError::WrongModel(ModelName::SmolLm2))
        ));
    }
}
