//! `hookd apply -f`: the multi-document YAML parser (WebhookEndpoint and Secret objects,
//! CEL rules and schema bounds) and the plan built from its output. Input: the file text.
#![no_main]

use std::path::{Path, PathBuf};

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // `apply::load` reads files with read_to_string, so non-UTF-8 never reaches the parser.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let file = Path::new("fuzz.yaml");
    let Ok(docs) = hookd::apply::parse_documents(file, text) else {
        return;
    };
    let _ = hookd::apply::plan(&[(PathBuf::from(file), docs)]);
});
