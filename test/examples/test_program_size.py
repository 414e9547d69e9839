#!/usr/bin/env python3
"""A user program stays short and the README shows it whole: at most LIMIT lines of code (blank
lines and // comments not counted, includes counted), and its code, from the first #include on,
appears verbatim in README.md.
usage: test_program_size.py PROGRAM README LIMIT"""
import sys

program, readme, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
source = open(program, encoding='utf-8').read()
code = [line for line in source.splitlines() if line.strip() and not line.strip().startswith('//')]
shown = source[source.index('#include'):]
in_readme = shown in open(readme, encoding='utf-8').read()
print(f'{program}: {len(code)} lines of code (at most {limit}); shown whole in the README: {in_readme}')
sys.exit(0 if len(code) <= limit and in_readme else 1)
