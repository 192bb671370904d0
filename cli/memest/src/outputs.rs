//! An output never replaces an input: the one check of every command that writes a file.

use std::path::Path;

/// Refuses to write `out` (given by `flag`) where it is one of `inputs`, each with the words
/// that say which input it is (`"the --dataset"`): writing it would destroy that input.
pub fn refuse_input<'a>(
    flag: &str,
    out: &Path,
    inputs: impl IntoIterator<Item = (&'a str, &'a Path)>,
) -> anyhow::Result<()> {
    for (what, input) in inputs {
        if trace::same_file(input, out) {
            anyhow::bail!(
                "{flag} {} is {what} {}: writing it would destroy that input; give another path",
                out.display(),
                input.display()
            );
        }
    }
    Ok(())
}
