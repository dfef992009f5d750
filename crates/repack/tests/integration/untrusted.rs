//! Inputs that used to abort or panic the `repack` binary, one test per problem: each must now
//! be refused with exit status 1 (not a signal, not a panic's 101), naming the problem, with
//! nothing written.

use std::path::Path;

use crate::support::{f4_header, npy_bytes, path, repack};

/// Runs `repack`, requires a plain refusal (exit status 1) that wrote nothing to `output`, and
/// returns stderr.
fn refused(args: &[&str], output: &Path) -> String {
    let result = repack(args);
    let stderr = String::from_utf8_lossy(&result.stderr).into_owned();
    // `code()` is None when a signal (SIGABRT from a failed allocation) ended the process.
    assert_eq!(result.status.code(), Some(1), "repack {args:?}:\n{stderr}");
    assert!(
        !output.exists(),
        "repack {args:?} wrote {}",
        output.display()
    );
    assert!(result.stdout.is_empty(), "repack {args:?} printed a report");
    stderr
}

#[test]
fn quantize_refuses_an_npy_header_declaring_a_huge_shape_over_16_bytes_instead_of_aborting() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("huge.npy");
    let shape = format!("({}, {})", 1u64 << 40, 1u64 << 20);
    std::fs::write(&input, npy_bytes(&f4_header(&shape), &[0; 16])).unwrap();
    let output = dir.path().join("out.gguf");
    let stderr = refused(
        &["quantize", "--to", "q4_0", path(&input), path(&output)],
        &output,
    );
    assert!(stderr.contains("1099511627776 x 1048576"), "{stderr}");
    assert!(stderr.contains("16 bytes follow the header"), "{stderr}");
}

#[test]
fn quantize_names_a_vector_instead_of_quoting_ndarray_npys_ndim() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("vector.npy");
    std::fs::write(&input, npy_bytes(&f4_header("(12,)"), &[0; 48])).unwrap();
    let output = dir.path().join("out.safetensors");
    let stderr = refused(
        &["quantize", "--to", "nf4", path(&input), path(&output)],
        &output,
    );
    assert_eq!(
        stderr,
        format!(
            "repack: error: {}: not a float32 matrix in .npy format: it has 1 dimension (shape \
             [12]); quantize needs a 2-D float32 matrix [rows, cols]: to quantize it as one row, \
             save x.reshape(1, 12)\n",
            input.display()
        )
    );
}

#[test]
fn quantize_refuses_a_fortran_order_matrix_instead_of_quantizing_it() {
    // It used to be read (transposed back by ndarray-npy) and quantized without a word.
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("fortran.npy");
    let header = "{'descr': '<f4', 'fortran_order': True, 'shape': (1, 32), }";
    std::fs::write(&input, npy_bytes(header, &[0; 128])).unwrap();
    let output = dir.path().join("out.gguf");
    let stderr = refused(
        &["quantize", "--to", "q8_0", path(&input), path(&output)],
        &output,
    );
    assert!(stderr.contains("Fortran"), "{stderr}");
}

#[test]
fn dequantize_refuses_nf4_cols_whose_row_size_overflows_instead_of_panicking() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("x.bin");
    std::fs::write(&input, [0u8; 8]).unwrap();
    let output = dir.path().join("out.npy");
    let cols = usize::MAX.to_string();
    let stderr = refused(
        &[
            "dequantize",
            "--raw",
            "--from",
            "nf4",
            "--cols",
            &cols,
            "--block-size",
            "1",
            path(&input),
            path(&output),
        ],
        &output,
    );
    assert!(stderr.contains("does not fit"), "{stderr}");
}

#[cfg(unix)]
#[test]
fn inspect_refuses_a_device_instead_of_reading_until_memory_runs_out() {
    // std::fs::read("/dev/zero") never returns: it grows its buffer until the process dies.
    let dir = tempfile::tempdir().unwrap();
    let stderr = refused(&["inspect", "/dev/zero"], &dir.path().join("none"));
    assert!(stderr.contains("not a regular file"), "{stderr}");
}

#[test]
fn inspect_refuses_a_header_length_past_the_end_of_the_file_with_both_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("x.safetensors");
    let mut bytes = (1u64 << 40).to_le_bytes().to_vec();
    bytes.extend(b"{}");
    std::fs::write(&input, bytes).unwrap();
    let stderr = refused(&["inspect", path(&input)], &dir.path().join("none"));
    assert!(stderr.contains("1099511627776 bytes"), "{stderr}");
    assert!(stderr.contains("only 2 bytes follow"), "{stderr}");
}

/// A FIFO with no writer: `open` on it used to block until a writer came, so every command
/// hung. Each command that reads an input now refuses it at once (well inside the timeout),
/// naming it, with nothing written.
#[cfg(unix)]
#[test]
fn every_command_refuses_a_fifo_with_no_writer_without_blocking() {
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("input");
    let made = Command::new("mkfifo").arg(&fifo).status();
    assert!(made.is_ok_and(|s| s.success()), "mkfifo");
    let [gguf, npy, safetensors] =
        ["out.gguf", "out.npy", "out.safetensors"].map(|name| dir.path().join(name));
    let fifo = path(&fifo);
    let (gguf, npy, safetensors) = (path(&gguf), path(&npy), path(&safetensors));
    let commands: [(&[&str], &str); 5] = [
        (&["inspect", fifo], npy),
        (&["quantize", "--to", "q4_0", fifo, gguf], gguf),
        (&["dequantize", fifo, npy], npy),
        (
            &[
                "dequantize",
                "--raw",
                "--from",
                "q8_0",
                "--cols",
                "32",
                fifo,
                npy,
            ],
            npy,
        ),
        (
            &[
                "convert",
                "--from",
                "gptq",
                "--to",
                "awq",
                "--group-size",
                "32",
                fifo,
                safetensors,
            ],
            safetensors,
        ),
    ];
    for (args, out) in commands {
        let mut child = Command::new(env!("CARGO_BIN_EXE_repack"))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let start = Instant::now();
        while child.try_wait().unwrap().is_none() {
            if start.elapsed() > Duration::from_secs(20) {
                child.kill().unwrap();
                child.wait().unwrap();
                panic!("repack {args:?} blocked on a FIFO with no writer");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let result = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&result.stderr);
        assert_eq!(result.status.code(), Some(1), "repack {args:?}: {stderr}");
        assert_eq!(
            stderr,
            format!(
                "repack: error: {fifo}: not a regular file; inputs are read whole, and only a \
                 regular file's size is known before reading it\n"
            ),
            "repack {args:?}"
        );
        assert!(result.stdout.is_empty(), "repack {args:?}");
        assert!(!Path::new(out).exists(), "repack {args:?}");
    }
}
