//! `repack bpw` as a user drives it: the worked example table, one layout part by part, and
//! refusals.

use std::process::{Command, Output};

fn runner(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_repack"))
        .args(args)
        .output()
        .expect("repack starts")
}

fn stdout_of(args: &[&str]) -> String {
    let out = runner(args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn with_no_layout_flags_it_prints_the_worked_example() {
    let text = stdout_of(&["bpw"]);
    assert!(
        text.starts_with("One 4096 x 4096 matrix: 16,777,216 weights, 33,554,432 bytes in fp16."),
        "{text}"
    );
    for (layout, bits) in [
        ("4-bit g128, f16 scales ", "4.125"),
        ("4-bit g32, f16 scale + f16 zero ", "5.000"),
        ("GGUF Q4_0 (block 32, f16 d) ", "4.500"),
        ("GGUF Q8_0 (block 32, f16 d) ", "8.500"),
        ("NF4 (block 64, f32 absmax) ", "4.500"),
    ] {
        let line = text
            .lines()
            .find(|line| line.starts_with(layout))
            .unwrap_or_else(|| panic!("no row for {layout:?} in\n{text}"));
        assert!(line.ends_with(&format!("  {bits}")), "{line}");
    }
    assert!(
        text.contains("7,656,250,000 bytes apart = 7.66 GB (10^9 bytes) = 7.13 GiB (2^30 bytes)"),
        "{text}"
    );
}

#[test]
fn layout_flags_print_one_layout_part_by_part() {
    let text = stdout_of(&[
        "bpw",
        "--bits",
        "4",
        "--group",
        "128",
        "--zeros",
        "packed",
        "--g-idx",
        "--container",
        "line-words",
    ]);
    assert!(
        text.contains("  codes                  8,388,608 B"),
        "{text}"
    );
    assert!(
        text.contains("  zero points               65,536 B"),
        "{text}"
    );
    assert!(
        text.contains("  g_idx                     16,384 B"),
        "{text}"
    );
    assert!(text.contains("= 4.1640625 bits per element"), "{text}");
}

#[test]
fn bad_layouts_are_refused_with_the_reason() {
    let out = runner(&["bpw", "--bits", "9"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("unsupported bit width 9"), "{stderr}");
    let out = runner(&["bpw", "--group", "64"]);
    assert!(!out.status.success(), "layout flags need --bits");
    let out = runner(&["bpw", "--shape", "4096"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("expected ROWSxCOLS"));
}

#[test]
fn sizes_that_overflow_are_refused_not_wrapped() {
    let width = usize::BITS;
    for (args, message) in [
        (
            &["bpw", "--shape", "99999999999x99999999999"][..],
            format!(
                "repack: error: the element count (rows x cols) of a 99999999999 x 99999999999 \
                 matrix does not fit in {width} bits; refusing to print a wrapped number\n"
            ),
        ),
        (
            &[
                "bpw",
                "--bits",
                "4",
                "--extra-bytes-per-group",
                "18446744073709551615",
            ][..],
            format!(
                "repack: error: the extra metadata bytes (groups x extra bytes per group) of a \
                 4096 x 4096 matrix does not fit in {width} bits; refusing to print a wrapped \
                 number\n"
            ),
        ),
    ] {
        let out = runner(args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert_eq!(String::from_utf8_lossy(&out.stderr), message, "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}: no partial output");
    }
}
