"""``posttrainllm`` on the command line: ``posttrainllm study status|fill|check``, ``posttrainllm coverage``,
``posttrainllm models``, ``posttrainllm progress``."""


from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import posttrainllm
from posttrainllm import atomic
from posttrainllm.tools import answers, coverage, record, study

DESCRIPTION = ("The posttrainllm book's command line: the study queue, the coverage map, the shared models and "
               "your progress through the gates.")
# the extra that installs a missing module, for the one-line error a command gives without it
EXTRAS = {"torch": "torch"}


def _status(args: argparse.Namespace) -> int:
    adopted = [] if args.file else study.adopt_clone_answers()
    topics = study.load(args.file)
    filled = sum(t.filled for t in topics)
    print(f"{filled} of {len(topics)} topics have a 'Why here' ({len(topics) - filled} TBD); "
          f"your answers: {study.where(args.file)}\n")
    if adopted:
        print(f"copied {len(adopted)} answers from this clone's book/study-queue.md into your answers file "
              "(the clone's file is unchanged; `git checkout book/study-queue.md` clears them there)\n")
    for topic in topics:
        mark = "filled" if topic.filled else "TBD   "
        print(f"[{mark}] {topic.name}")
        for label, target in topic.taught_in:
            print(f"           taught in: {label} -> {target}")
    if not args.file and (lost := study.orphans()):
        print("\nyour answers file also has answers for topics the queue no longer has: " + ", ".join(lost))
    return 0


def _fill(args: argparse.Namespace) -> int:
    if not args.file:
        study.adopt_clone_answers()  # so an earlier answer in the clone's file counts for --force
    topic = study.fill(args.topic, args.text, force=args.force, path=args.file)
    print(f'saved "Why here" for "{topic.name}" in {study.where(args.file)}')
    return 0


def _check(args: argparse.Namespace) -> int:
    problems = study.check(args.file)
    for problem in problems:
        print(f"study queue: {problem}", file=sys.stderr)
    if not problems:
        print(f"study queue OK: every topic has a teaching anchor that exists ({args.file or study.queue_path()})")
    return 1 if problems else 0


def _export(args: argparse.Namespace) -> int:
    markdown = study.text(args.file)
    if args.to is None:
        sys.stdout.write(markdown)
    else:
        atomic.write_text(args.to, markdown)
        print(f"wrote the queue with your answers to {args.to}", file=sys.stderr)
    return 0


def _import(args: argparse.Namespace) -> int:
    copied = study.import_answers(args.source, force=args.force)
    print(f"imported {len(copied)} answers from {args.source} into {study.where()}")
    return 0


def _coverage(args: argparse.Namespace) -> int:
    root = coverage.book_root(args.root)
    missing = coverage.untaught(root)
    for item, sections in coverage.coverage_map(root).items():
        where = "; ".join(f"{s.notebook} § {s.title}" for s in sections) or "-"
        print(f"{item:36s} {where}")
    if missing:
        print("\nnot taught by any notebook yet: " + ", ".join(missing))
    return 0


def _models(args: argparse.Namespace) -> int:
    from posttrainllm import data
    from posttrainllm.tools import models

    print(f"the notebooks' shared models, in {data.default_cache_dir()}:", flush=True)
    taken = models.build_all(out=sys.stdout, record=args.record)
    print(f"all {len(taken)} models ready in {sum(taken.values()) / 60:.1f} min", flush=True)
    return 0


def _progress(args: argparse.Namespace) -> int:
    from posttrainllm.tools import mastery

    passed = record.load()  # a damaged record is an error here, not a line of the table
    print(f"the gates you have passed, from {record.path()}:")
    print(mastery.progress())
    print(f"{len(passed)} passed in all")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="posttrainllm", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"posttrainllm {posttrainllm.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    st = sub.add_parser("study", help="the study queue and your answers")
    st.add_argument("--file", type=Path, default=None,
                    help="keep answers in this Markdown queue (e.g. your fork's book/study-queue.md) instead")
    st_sub = st.add_subparsers(dest="action", required=True)
    st_sub.add_parser("status", help="topics, filled vs TBD, and where each is taught").set_defaults(
        run=_status
    )
    fill = st_sub.add_parser("fill", help="write a topic's 'Why here' (changes nothing else)")
    fill.add_argument("topic", help='the exact topic name, e.g. "Online softmax"')
    fill.add_argument("text", help="your 'Why here' answer")
    fill.add_argument("--force", action="store_true", help="replace an existing answer")
    fill.set_defaults(run=_fill)
    st_sub.add_parser("check", help="fail if a topic's teaching anchor is missing or broken").set_defaults(
        run=_check
    )
    exp = st_sub.add_parser("export", help="the queue with your answers, as Markdown (to keep, or for a fork)")
    exp.add_argument("--to", type=Path, default=None, help="write it to this file (default: print it)")
    exp.set_defaults(run=_export)
    imp = st_sub.add_parser("import", help="copy the answers of a Markdown queue into your answers file")
    imp.add_argument("source", type=Path, help="a study-queue.md with answers, e.g. one `study export` wrote")
    imp.add_argument("--force", action="store_true", help="replace answers you saved before")
    imp.set_defaults(run=_import)
    cov = sub.add_parser("coverage", help="which notebook section teaches each module")
    cov.add_argument("--root", type=Path, default=None, help="a clone of the book (default: the one you are in)")
    cov.set_defaults(run=_coverage)
    mod = sub.add_parser("models", help="train the notebooks' shared models into the cache, once")
    mod.add_argument("--record", type=Path, default=None,
                     help="write the times to this file (assets/model_times.json, from an empty cache)")
    mod.set_defaults(run=_models)
    sub.add_parser("progress", help="the mastery gates you have passed, module by module").set_defaults(
        run=_progress)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code = args.run(args)
        sys.stdout.flush()  # inside the try, so a closed pipe is caught here and not at exit
        return code
    except BrokenPipeError:  # `posttrainllm study status | head -1`: the reader has what they wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's advice: no error at exit
        return 0
    except ModuleNotFoundError as err:
        extra = EXTRAS.get((err.name or "").split(".")[0])
        if extra is None:
            raise
        print(f"error: `posttrainllm {args.command}` needs {err.name}, which is not installed: "
              f"pip install 'posttrainllm[{extra}]'", file=sys.stderr)
        return 2
    except (study.StudyQueueError, answers.AnswersError, record.RecordError, OSError, UnicodeDecodeError) as err:
        print(f"error: {_reason(err)}", file=sys.stderr)
        return 2


def _reason(err: Exception) -> str:
    """One line a reader can act on, for the errors a wrong path or a damaged file gives."""
    if isinstance(err, IsADirectoryError):
        return f"{err.filename} is a folder; give the study-queue file itself (book/study-queue.md)"
    if isinstance(err, PermissionError):
        return f"no permission to write or read {err.filename} ({err.strerror})"
    if isinstance(err, UnicodeDecodeError):
        return f"the study-queue file is not UTF-8 text ({err.reason} at byte {err.start})"
    if isinstance(err, OSError) and err.filename:
        return f"{err.filename}: {err.strerror}"
    return str(err)
