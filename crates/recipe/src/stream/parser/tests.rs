use super::*;

fn parse(options: &ParsingOptions, chunks: &[&str]) -> Vec<Out> {
    let mut p = Parser::new(
        options,
        Spellings {
            think_end: None,
            dsml: None,
        },
    );
    let mut out = Vec::new();
    for c in chunks {
        p.push(Mode::Text, c.as_bytes(), &mut out);
    }
    p.finish(&mut out);
    out
}

fn content(out: &[Out]) -> String {
    out.iter()
        .filter_map(|o| match o {
            Out::Content { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_byte_breaking_a_partial_marker_never_splits_a_character() {
    let options = ParsingOptions {
        parse_tool_calls: false,
        ..ParsingOptions::default()
    };
    for text in ["<｜e", "<｜end▁of▁sentence｜>", "</日本", "<😀"] {
        let out = parse(&options, &[text]);
        assert_eq!(content(&out), text);
        for o in &out {
            if let Out::Content { text, .. } = o {
                assert!(!text.contains('\u{FFFD}'), "{text:?}");
            }
        }
    }
    assert_eq!(incomplete_tail(b"ab\xEF"), 2);
    assert_eq!(incomplete_tail(b"ab\xEF\xBD"), 2);
    assert_eq!(incomplete_tail("ab｜".as_bytes()), 5);
    assert_eq!(incomplete_tail(b"\xF0\x9F\x98"), 0);
}
