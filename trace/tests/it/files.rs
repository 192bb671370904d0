//! File-level API: `TraceWriter::create` (temp file + rename), `Reader::open`.

use trace::*;

use crate::support::{binary, small_trace};

fn write_file(path: &std::path::Path) -> (Header, Vec<Record>) {
    let (h, recs) = small_trace();
    let mut w = TraceWriter::create(path, &h).unwrap();
    for r in &recs {
        w.write(r).unwrap();
    }
    assert_eq!(w.events_written(), recs.len() as u64);
    let bytes = w.bytes_written();
    assert_eq!(w.finish().unwrap(), path);
    assert_eq!(std::fs::metadata(path).unwrap().len(), bytes, "bytes_written matches the file");
    (h, recs)
}

fn read_file(path: &std::path::Path) -> (Header, Vec<Record>, Summary) {
    let mut r = Reader::open(path).unwrap();
    let recs: Vec<Record> = r.by_ref().collect::<Result<_, _>>().unwrap();
    (r.header().clone(), recs, r.summary())
}

/// `small_trace()` in binary, cut inside its last frame, written to `dir/cut.mtrace`.
fn cut_trace(dir: &std::path::Path) -> std::path::PathBuf {
    let (h, recs) = small_trace();
    let bytes = binary(&h, &recs);
    let cut = dir.join("cut.mtrace");
    std::fs::write(&cut, &bytes[..bytes.len() - 2]).unwrap();
    cut
}

#[test]
fn create_picks_the_form_from_the_extension() {
    let dir = tempfile::tempdir().unwrap();
    // Upper case too, as the readers take it.
    for (name, format) in [
        ("a.mtrace", Format::Binary),
        ("b.jsonl", Format::Jsonl),
        ("C.MTRACE", Format::Binary),
        ("d.JsonL", Format::Jsonl),
    ] {
        let path = dir.path().join(name);
        let (h, recs) = write_file(&path);
        let (h2, recs2, sum) = read_file(&path);
        assert_eq!((h2, recs2, sum.format), (h, recs, format));
    }
    let err = TraceWriter::create(dir.path().join("c.json"), &small_trace().0).err().unwrap().to_string();
    assert!(err.contains("c.json") && err.contains(".mtrace"), "{err}");
}

#[test]
fn no_file_appears_unless_finished() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.mtrace");
    let (h, recs) = small_trace();
    {
        let mut w = TraceWriter::create(&path, &h).unwrap();
        w.write(&recs[0]).unwrap();
        w.flush().unwrap();
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names.len(), 1, "one temporary file while writing: {names:?}");
        assert!(!path.exists(), "the final path appears only on finish");
    } // dropped without finish, as on an error
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "nothing left behind");
}

#[test]
fn open_errors_name_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.mtrace");
    let err = Reader::open(&missing).err().unwrap().to_string();
    assert!(err.contains("missing.mtrace") && err.contains("cannot open trace"), "{err}");
    assert!(!err.contains("standard input"), "{err}");
    // `-` is a file name here, not standard input, and said so (it was "No such file").
    let err = Reader::open("-").err().unwrap().to_string();
    assert!(err.contains("`-` is not standard input here") && err.contains("/dev/stdin"), "{err}");

    let bad = dir.path().join("bad.mtrace");
    std::fs::write(&bad, b"hello world").unwrap();
    let err = Reader::open(&bad).err().unwrap().to_string();
    assert!(err.contains("bad.mtrace") && err.contains("not a memtrace trace"), "{err}");

    // Errors found while iterating name the path too.
    let (h, recs) = small_trace();
    let mut bytes = binary(&h, &recs);
    bytes.extend_from_slice(&[0, 1, 0]);
    let late = dir.path().join("late.mtrace");
    std::fs::write(&late, &bytes).unwrap();
    let mut r = Reader::open(&late).unwrap();
    let err = r.find_map(Result::err).unwrap().to_string();
    assert!(err.contains("late.mtrace") && err.contains(&format!("at byte {}", bytes.len() - 3)), "{err}");
}

/// `memsim convert --strict` refused a truncated input after the copy had replaced the file
/// at the output path, and removed it: the user's earlier file was gone. A writer dropped
/// unfinished must leave it.
#[test]
fn an_unfinished_writer_leaves_the_output_path_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let cut = cut_trace(dir.path());
    let out = dir.path().join("out.mtrace");
    std::fs::write(&out, "earlier").unwrap();
    let mut r = Reader::open(&cut).unwrap();
    let mut w = TraceWriter::create(&out, r.header()).unwrap();
    for rec in r.by_ref() {
        w.write(&rec.unwrap()).unwrap();
    }
    assert!(r.summary().truncated);
    drop(w);
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "earlier");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2, "a temporary file was left behind");
}

#[test]
fn header_is_on_disk_before_the_first_flush() {
    // A process killed right after starting still leaves a readable (empty) trace.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("early.mtrace");
    let (h, recs) = small_trace();
    let mut w = BinaryWriter::new(std::fs::File::create(&path).unwrap(), &h).unwrap();
    w.write(&recs[0]).unwrap();
    let (h2, got, sum) = read_file(&path);
    assert_eq!((h2, got.len(), sum.truncated), (h, 0, false));
    std::mem::forget(w); // as SIGKILL would: no drop, no flush
}

/// `Reader::open` maps a regular file and hands read parts back to the kernel as it goes: a
/// file larger than a few of those steps reads exactly what streaming the same bytes reads, and
/// a truncated one stops at the same place.
#[test]
fn a_mapped_file_reads_what_a_stream_reads() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.mtrace");
    let h = Header::new("test", "1", Level::Device);
    let mut w = TraceWriter::create(&path, &h).unwrap();
    let mut i = 0u64;
    while w.bytes_written() < 20 << 20 {
        let event = if i.is_multiple_of(3) {
            Event::Alloc(Alloc::device(0x7f00_0000_0000 + i * 512, 512 + i, Api::CudaMalloc, Origin::Outcome))
        } else {
            Event::Marker(Marker { text: format!("m{i}") })
        };
        w.write(&Record { ts_ns: Some(i * 1000), tid: Some(1), device: Some(0), event }).unwrap();
        i += 1;
    }
    w.finish().unwrap();
    let streamed = |bytes: &[u8]| {
        let mut r = open_reader(bytes).unwrap();
        let recs: Vec<Record> = r.by_ref().collect::<Result<_, _>>().unwrap();
        (recs, r.summary())
    };
    let bytes = std::fs::read(&path).unwrap();
    let (mapped, ms) = {
        let mut r = Reader::open(&path).unwrap();
        let recs: Vec<Record> = r.by_ref().collect::<Result<_, _>>().unwrap();
        (recs, r.summary())
    };
    let (want, ws) = streamed(&bytes);
    assert_eq!(mapped.len() as u64, i);
    assert!(mapped == want, "mapped and streamed records differ");
    assert_eq!(ms, ws);
    // Cut inside the last frame.
    let cut = &bytes[..bytes.len() - 3];
    std::fs::write(&path, cut).unwrap();
    let mut r = Reader::open(&path).unwrap();
    let n = r.by_ref().count();
    let (want, ws) = streamed(cut);
    assert_eq!(n, want.len());
    assert!(r.summary().truncated && ws.truncated);
    assert_eq!(r.summary(), ws);
}

/// An output path that is a symbolic link is written where the link points, as a shell's `>`
/// writes it: renaming the finished file over the link replaced the link and left its target
/// as it was. A relative link, a dangling one and a chain of two alike.
#[test]
fn an_output_through_a_link_lands_on_its_target() {
    use std::os::unix::fs::symlink;
    let dir = tempfile::tempdir().unwrap();
    let keep = dir.path().join("keep");
    std::fs::create_dir(&keep).unwrap();
    std::fs::write(keep.join("real.mtrace"), b"old").unwrap();
    symlink("keep/real.mtrace", dir.path().join("rel.mtrace")).unwrap();
    symlink(keep.join("new.jsonl"), dir.path().join("dangling.jsonl")).unwrap();
    symlink(dir.path().join("rel.mtrace"), dir.path().join("chain.mtrace")).unwrap();
    for (link, target) in
        [("rel.mtrace", "real.mtrace"), ("dangling.jsonl", "new.jsonl"), ("chain.mtrace", "real.mtrace")]
    {
        let link = dir.path().join(link);
        let (h, recs) = small_trace();
        let mut w = TraceWriter::create(&link, &h).unwrap();
        for r in &recs {
            w.write(r).unwrap();
        }
        w.finish().unwrap();
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink(), "{link:?} is still a link");
        assert_eq!(read_file(&keep.join(target)).1, recs, "{target}");
        // The bytes-in-memory writer alike.
        trace::atomic::write_bytes_atomic(&link, b"bytes").unwrap();
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
        assert_eq!(std::fs::read(keep.join(target)).unwrap(), b"bytes");
    }
}
