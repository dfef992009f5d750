//! A peer implementation timed in the same run as this project's cases: NumPy (and gguf-py for
//! the GGUF blocks), through `scripts/bench-numpy.py --serve`.
//!
//! Why in the same run: on a shared VM the memory bandwidth moves between phases (memcpy went
//! from 4.1 to 10.7 GB/s within hours on this project's), while NumPy's compute-bound kernels
//! move less, so ratios to memcpy taken in two runs minutes apart overstate one side. Here each
//! case is timed by `bench`, then at once by the peer on an input of the same shape, and both
//! are reported in absolute GB/s side by side, each beside its own memcpy of the same moment.
//!
//! The protocol is one JSON object per line each way: a request carries the case's key (op,
//! format, mode, axis, bits, group size), its input shape, and the warm-up and repeat counts;
//! the answer is `{"median_s", "bytes", "implementation"}`, `{"unsupported": why}` for a case
//! the peer has no version of, or `{"error": what}`. A request `{"op": "memcpy"}` times
//! `np.copyto` of 256 MiB.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use serde::{Deserialize, Serialize};

use crate::cases::Measured;
use crate::measure::Settings;
use crate::report::Row;

/// The script `bench --numpy` starts, in this repository.
pub const NUMPY_SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/bench-numpy.py");

/// What can go wrong with the peer, each naming the step.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    #[error("starting {program} {script}")]
    Start {
        program: String,
        script: String,
        source: std::io::Error,
    },
    #[error("talking to the peer: {0}")]
    Io(#[from] std::io::Error),
    #[error("the peer ended without answering (its errors are above)")]
    Ended,
    #[error("the peer's answer {line:?} is not one")]
    Answer {
        line: String,
        source: serde_json::Error,
    },
    #[error("the peer failed on {case}: {message}")]
    Failed { case: String, message: String },
}

/// A running peer.
pub struct Peer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// What it runs (`numpy 2.4.6, gguf-py 0.19.0`), from its first answer.
    pub implementation: String,
}

#[derive(Serialize)]
struct Request<'a> {
    op: &'a str,
    format: &'a str,
    mode: Option<&'a str>,
    axis: Option<&'a str>,
    bits: Option<u32>,
    group_size: Option<usize>,
    shape: [usize; 2],
    warmup: usize,
    repeats: usize,
}

#[derive(Deserialize)]
struct Answer {
    median_s: Option<f64>,
    bytes: Option<usize>,
    implementation: Option<String>,
    unsupported: Option<String>,
    error: Option<String>,
}

/// One case timed by the peer, beside this project's timing of it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PeerRow {
    /// The peer's measurement, against the peer's memcpy.
    #[serde(flatten)]
    pub row: Row,
    /// What ran it.
    pub implementation: String,
    /// This project's GB/s on the same case, timed just before.
    pub bench_gbps: f64,
    /// `bench_gbps / gbps`.
    pub bench_over_peer: f64,
}

impl Peer {
    /// Starts `program script --serve` (`python3` and [`NUMPY_SCRIPT`] by default).
    pub fn start(program: &str, script: &Path) -> Result<Peer, PeerError> {
        let mut child = Command::new(program)
            .arg(script)
            .arg("--serve")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|source| PeerError::Start {
                program: program.to_string(),
                script: script.display().to_string(),
                source,
            })?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        Ok(Peer {
            child,
            stdin,
            stdout,
            implementation: String::new(),
        })
    }

    fn ask(&mut self, request: &Request, case: &str) -> Result<Option<(f64, usize)>, PeerError> {
        let line = serde_json::to_string(request).expect("a request serializes");
        writeln!(self.stdin, "{line}")?;
        self.stdin.flush()?;
        let mut answer = String::new();
        if self.stdout.read_line(&mut answer)? == 0 {
            return Err(PeerError::Ended);
        }
        let parsed: Answer = serde_json::from_str(&answer).map_err(|source| PeerError::Answer {
            line: answer.trim_end().to_string(),
            source,
        })?;
        if let Some(message) = parsed.error {
            return Err(PeerError::Failed {
                case: case.to_string(),
                message,
            });
        }
        if let Some(implementation) = parsed.implementation {
            self.implementation = implementation;
        }
        if parsed.unsupported.is_some() {
            return Ok(None);
        }
        match (parsed.median_s, parsed.bytes) {
            (Some(seconds), Some(bytes)) if seconds > 0.0 => Ok(Some((seconds, bytes))),
            _ => Err(PeerError::Answer {
                line: answer.trim_end().to_string(),
                source: serde::de::Error::custom("no positive median_s and bytes"),
            }),
        }
    }

    /// The peer's memcpy (`np.copyto` of 256 MiB), in 10^9 bytes per second.
    pub fn memcpy_gbps(&mut self, settings: Settings) -> Result<f64, PeerError> {
        let request = Request {
            op: "memcpy",
            format: "-",
            mode: None,
            axis: None,
            bits: None,
            group_size: None,
            shape: [0, 0],
            warmup: settings.warmup,
            repeats: settings.repeats,
        };
        let (seconds, bytes) = self.ask(&request, "memcpy")?.ok_or(PeerError::Ended)?;
        Ok(bytes as f64 / seconds / 1e9)
    }

    /// Times `case` (already measured by this project, on an input of `shape`) in the peer:
    /// its row, or `None` when the peer has no version of it.
    pub fn time(
        &mut self,
        ours: &Row,
        shape: [usize; 2],
        settings: Settings,
        memcpy_gbps: f64,
    ) -> Result<Option<PeerRow>, PeerError> {
        let case = &ours.case;
        let request = Request {
            op: case.op,
            format: case.format,
            mode: case.mode,
            axis: case.axis,
            bits: case.bits,
            group_size: case.group_size,
            shape,
            warmup: settings.warmup,
            repeats: settings.repeats,
        };
        let name = describe(case);
        let Some((seconds, bytes)) = self.ask(&request, &name)? else {
            return Ok(None);
        };
        if bytes != case.bytes {
            return Err(PeerError::Failed {
                case: name,
                message: format!("it counted {bytes} bytes where bench counts {}", case.bytes),
            });
        }
        let row = Row::new(
            Measured {
                median_s: seconds,
                memcpy_gbps,
                ..case.clone()
            },
            1,
        );
        Ok(Some(PeerRow {
            bench_over_peer: ours.gbps / row.gbps,
            bench_gbps: ours.gbps,
            implementation: self.implementation.clone(),
            row,
        }))
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        // Closing stdin ends the script's loop; wait so that no process outlives the bench.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A case in words: `symmetric 4-bit g32 token axis kv encode`.
pub fn describe(case: &Measured) -> String {
    let bits = case.bits.map(|b| format!("{b}-bit"));
    let group = case.group_size.map(|g| format!("g{g}"));
    let axis = case.axis.map(|a| format!("{a} axis"));
    [
        case.mode.map(str::to_string),
        bits,
        group,
        axis,
        Some(case.format.to_string()),
        Some(case.op.to_string()),
    ]
    .into_iter()
    .flatten()
    .collect::<Vec<_>>()
    .join(" ")
}

/// The rows as a markdown table: each case's GB/s here and in the peer, and their quotient.
pub fn table(rows: &[PeerRow], bench_memcpy: f64, peer_memcpy: f64) -> String {
    let mut builder = tabled::builder::Builder::default();
    builder.push_record(["case", "bench GB/s", "peer GB/s", "bench / peer"]);
    builder.push_record([
        "memcpy (each side's, same run)".to_string(),
        format!("{bench_memcpy:.2}"),
        format!("{peer_memcpy:.2}"),
        format!("{:.2}", bench_memcpy / peer_memcpy),
    ]);
    for row in rows {
        builder.push_record([
            describe(&row.row.case),
            format!("{:.2}", row.bench_gbps),
            format!("{:.3}", row.row.gbps),
            format!("{:.1}", row.bench_over_peer),
        ]);
    }
    let mut table = builder.build();
    table.with(tabled::settings::Style::markdown()).modify(
        tabled::settings::object::Columns::new(1..),
        tabled::settings::Alignment::right(),
    );
    table.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_case_reads_as_words() {
        let case = Measured {
            op: "encode",
            format: "kv",
            mode: Some("symmetric"),
            axis: Some("token"),
            bits: Some(4),
            group_size: Some(32),
            bytes: 1 << 20,
            median_s: 0.001,
            memcpy_gbps: 10.0,
        };
        assert_eq!(describe(&case), "symmetric 4-bit g32 token axis kv encode");
    }

    fn shell_peer(answer: &str) -> Peer {
        let dir = std::env::temp_dir().join(format!("bench-peer-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let script = dir.join(format!("peer-{}.sh", answer.len()));
        std::fs::write(&script, format!("read line\necho '{answer}'\n")).unwrap();
        Peer::start("sh", &script).unwrap()
    }

    #[test]
    fn a_peer_answers_its_memcpy_time() {
        let settings = Settings {
            warmup: 1,
            repeats: 1,
            threads: 1,
        };
        let mut peer =
            shell_peer(r#"{"median_s": 0.5, "bytes": 1000000000, "implementation": "x 1"}"#);
        assert_eq!(peer.memcpy_gbps(settings).unwrap(), 2.0);
        assert_eq!(peer.implementation, "x 1");
    }

    #[test]
    fn a_garbled_or_failing_peer_is_an_error_naming_what_it_said() {
        let settings = Settings {
            warmup: 1,
            repeats: 1,
            threads: 1,
        };
        for (answer, expected) in [
            ("not json", "not json"),
            (r#"{"error": "boom"}"#, "boom"),
            (r#"{"median_s": 0, "bytes": 4}"#, "median_s"),
        ] {
            let err = shell_peer(answer).memcpy_gbps(settings).unwrap_err();
            assert!(format!("{err}").contains(expected), "{answer}: {err}");
        }
    }

    #[test]
    fn a_missing_peer_is_an_error_naming_the_program() {
        let err = match Peer::start("/nonexistent/python3", Path::new(NUMPY_SCRIPT)) {
            Err(err) => err.to_string(),
            Ok(_) => panic!("started a program that does not exist"),
        };
        assert!(err.contains("/nonexistent/python3"), "{err}");
    }
}
