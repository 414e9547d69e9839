"""The layering rules of include/kfsdp/, read from the #include lines of its headers: compute/ and
infer/ include nothing of FSDP (fsdp/, train/, session), optim/ includes no io/ header, and fsdp/
includes no io/ or train/ header. Prints each include that breaks a rule and exits 1."""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1]) / 'include' / 'kfsdp'
rules = {  # folder: the kfsdp paths its headers must not include
    'compute': ('fsdp/', 'train/', 'session', 'comm/'),
    'infer': ('fsdp/', 'train/', 'session'),
    'optim': ('io/', 'fsdp/', 'train/'),
    'fsdp': ('io/', 'train/', 'compute/', 'infer/'),
}
include = re.compile(r'^\s*#\s*include\s*<kfsdp/([^>]+)>', re.M)
broken = []
for folder, banned in rules.items():
    for header in sorted((root / folder).rglob('*.hpp')):
        for target in include.findall(header.read_text()):
            if target.startswith(banned):
                broken.append(f'{header.relative_to(root.parent.parent)} includes <kfsdp/{target}>')
print('\n'.join(broken) if broken else f'{len(rules)} layering rules hold')
sys.exit(1 if broken else 0)
