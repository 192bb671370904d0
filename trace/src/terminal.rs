//! Text from a trace as a terminal should show it: `memsim` and `memest` print trace strings
//! (producer names, metadata, frames) in their warnings and lines, through this one helper.

use std::borrow::Cow;

/// `s` as the terminal should show it: a control character a trace carries (an escape sequence
/// in a producer's name, a newline in a metadata value) is written as its Rust escape (`\u{1b}`,
/// `\n`), so that no input can clear the screen or forge a line of the tool's output.
pub fn printable(s: &str) -> Cow<'_, str> {
    if !s.chars().any(char::is_control) {
        return s.into();
    }
    s.chars()
        .map(|c| if c.is_control() { c.escape_debug().to_string() } else { c.to_string() })
        .collect::<String>()
        .into()
}

/// Lines of text (ending in a newline or not) each made [`printable`], the newlines between them
/// kept: for a rendered page of lines, where the newlines are the tool's own.
pub fn printable_lines(text: &str) -> String {
    text.split_inclusive('\n')
        .map(|l| {
            let (body, end) = l.strip_suffix('\n').map_or((l, ""), |b| (b, "\n"));
            format!("{}{end}", printable(body))
        })
        .collect()
}
