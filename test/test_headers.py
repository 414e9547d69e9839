"""Every header of include/kfsdp/ is compiled by what the tests build: a file under test/ includes it,
or a source of the libraries and examples the tests link and run (src/, kernels/, examples/), or a
header one of those includes (the umbrella kfsdp/kfsdp.hpp aside: through it every header would
count). Where a header's test lives is test/meson.build's rule; this checks that none is left out.

usage: test_headers.py SOURCE_ROOT"""
import os, re, sys

INCLUDE = re.compile(r'^\s*#\s*include\s*[<"](kfsdp/[^>"]+)[>"]', re.M)
UMBRELLA = 'kfsdp/kfsdp.hpp'


def includes(path):
    with open(path, encoding='utf-8', errors='replace') as f:
        return set(INCLUDE.findall(f.read()))


def files(top, endings):
    for folder, _, names in os.walk(top):
        yield from (os.path.join(folder, n) for n in names if n.endswith(endings))


def main(root):
    include_dir = os.path.join(root, 'include')
    headers = {os.path.relpath(p, include_dir): includes(p)
               for p in files(os.path.join(include_dir, 'kfsdp'), ('.hpp', '.h'))}
    reached = set()
    for top in ('test', 'src', 'kernels', 'examples'):
        for path in files(os.path.join(root, top), ('.cpp', '.hpp', '.c', '.h')):
            reached |= includes(path)
    pending = [h for h in reached if h in headers and h != UMBRELLA]
    while pending:
        for included in headers[pending.pop()]:
            if included in headers and included not in reached:
                reached.add(included)
                pending.append(included)
    missing = sorted(set(headers) - reached)
    for header in missing:
        print(f'include/{header}: nothing the tests build includes it', file=sys.stderr)
    return 1 if missing else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), '..')))
