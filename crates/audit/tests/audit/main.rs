//! The audit as a user (and an adversary) meets it, in one test binary:
//!
//! - `archived`: the archived evidence and the root manifest PASS;
//! - `commit`: archived sources are checked at the commit that made them, not in the tree;
//! - `tampering`: a small run, made once, altered the ways a forger would (every manifest hash
//!   rewritten to match), several alterations per audit, each a FAIL naming the problem;
//! - `adversary`: the nine attacks of the "audit that trusts nothing" issue, one test each;
//! - `models`: a run on a real model's cache (MiniLM), altered as a forger would, and `--models`;
//! - `archives`: hostile npz archives (made by `tests/data/npz/make_hostile.py`) refused by rule,
//!   and every archive the audit accepts read exactly as NumPy reads it;
//! - `pins`: the root manifest's audit reads each pinned file once, through one directory
//!   handle, and compares the pins with what it read (a directory swapped in never PASSes; a
//!   linked directory is refused);
//! - `properties`: the npz reader and the decoder under generated inputs;
//! - `protocols`: the audit accepts exactly the protocols the runner accepts;
//! - `shards`: shards and merged runs;
//! - `quality`: model-quality evidence, hand-built and tampered with;
//! - `viewer`: the chart as a viewer sees it (a legend that pairs series wrongly, hidden or
//!   counterfeit markers, hidden text, a cropping viewBox) and figures in any script.

mod adversary;
mod archived;
mod archives;
mod commit;
mod models;
mod pins;
mod properties;
mod protocols;
mod quality;
mod schemes;
mod shards;
mod support;
mod tampering;
mod viewer;
