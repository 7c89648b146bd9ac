"""Reads the machine code (SASS) of compiled CUDA objects and fails when a hot kernel runs
off the tensor cores or any kernel uses local memory.

For every architecture given, each object must hold code for it; every kernel whose
name matches a --tensor-core pattern must contain a tensor-core instruction (HMMA, QMMA,
OMMA, IMMA or HGMMA), and at least one such kernel must exist per architecture; no kernel
may load or store local memory (LDL/STL: register spills or arrays the compiler could not
keep in registers). A kernel that is only a trap is one an architecture does not build
(its host side never launches it there) and is listed as such.

--require "KERNEL@ARCH=INSTRUCTION" (regular expressions over the demangled name, e.g.
"moeGemmKernel<.,1,.*,true>@sm_120=QMMA") asks that every kernel matching KERNEL on ARCH
contain INSTRUCTION, and that there is at least one: a native low-precision kernel must
use the native instruction, not an emulation.

Usage: sass_check.py --cuobjdump PATH --architectures "90;120" --tensor-core REGEX...
                     [--require SPEC...] OBJ...
"""
import argparse
import collections
import os
import re
import subprocess
import sys

MMA = re.compile(r"\b(HMMA|QMMA|OMMA|IMMA|HGMMA)\b")
LOCAL = re.compile(r"\b(LDL|STL)(\.|\s)")
INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][\w.]*)")


def kernels(sass):
    """{(arch, function): [instruction lines]} from cuobjdump --dump-sass output."""
    found = collections.defaultdict(list)
    arch = function = None
    for line in sass.splitlines():
        m = re.search(r"code for (sm_\w+)", line)
        if m:
            arch, function = m.group(1), None
            continue
        m = re.search(r"Function : (\S+)", line)
        if m:
            function = m.group(1)
            found[(arch, function)]
            continue
        if arch and function and "/*" in line:
            found[(arch, function)].append(line)
    return found


def demangled(name):
    """The last component of an Itanium-mangled name, with its integer, bool and enum
    template arguments (enums by value)."""
    if not name.startswith("_ZN"):
        return name
    i, last = 3, name
    while i < len(name) and name[i].isdigit():
        j = i
        while name[j].isdigit():
            j += 1
        length = int(name[i:j])
        last, i = name[j:j + length], j + length
    # Template arguments: L<type><value>E, the type a builtin letter or a nested enum name
    # N[S<n>_]<len><name>...E.
    args = re.match(r"I((?:L(?:[ibjl]|N(?:S\d*_)?(?:\d+\w+?)+E)-?\d+E)+)E", name[i:])
    if args:
        values = re.findall(r"L([ibjl]|N(?:S\d*_)?(?:\d+\w+?)+E)(-?\d+)E", args.group(1))
        last += "<" + ",".join(("true" if v == "1" else "false") if t == "b" else v
                               for t, v in values) + ">"
    return last


def requirement(spec):
    """(kernel regex, arch, instruction regex) from "KERNEL@ARCH=INSTRUCTION"."""
    m = re.fullmatch(r"(.+)@(sm_\w+)=(.+)", spec)
    if not m:
        raise argparse.ArgumentTypeError(f"{spec!r} is not KERNEL@ARCH=INSTRUCTION")
    return re.compile(m.group(1)), m.group(2), re.compile(m.group(3))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cuobjdump", required=True)
    parser.add_argument("--architectures", required=True)
    parser.add_argument("--tensor-core", action="append", default=[])
    # Kernels a --tensor-core pattern matches that still run on CUDA cores: a known gap,
    # marked in the table instead of failing the check.
    parser.add_argument("--cuda-cores-for-now", action="append", default=[])
    parser.add_argument("--require", action="append", default=[], type=requirement)
    parser.add_argument("objects", nargs="+")
    args = parser.parse_args()
    if not os.access(args.cuobjdump, os.X_OK):
        sys.exit(f"{args.cuobjdump} missing: scripts/install-deps.sh installs it (needs nvcc)")
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(args.cuobjdump) + os.pathsep + env.get("PATH", "")
    wanted = {"sm_" + a.strip() for a in args.architectures.replace(",", ";").split(";") if a.strip()}
    hot = [re.compile(p) for p in args.tensor_core]
    gaps = [re.compile(p) for p in args.cuda_cores_for_now]
    problems, hot_per_arch, rows = [], collections.Counter(), []
    required = collections.Counter()
    # ctest hands a generator expression's object list over as one ';'-separated argument.
    objects = [o for arg in args.objects for o in arg.split(";") if o]
    for obj in objects:
        out = subprocess.run([args.cuobjdump, "--dump-sass", obj], capture_output=True, text=True,
                             env=env)
        if "does not contain device code" in out.stdout + out.stderr:
            continue  # A host-only object of the library (cuBLASLt wrappers, ...).
        if out.returncode != 0:
            problems.append(f"{obj}: cuobjdump failed: {out.stderr.strip()}")
            continue
        found = kernels(out.stdout)
        archs = {a for a, _ in found}
        if found and not wanted <= archs:
            problems.append(f"{os.path.basename(obj)}: no code for {sorted(wanted - archs)}")
        for (arch, function), lines in sorted(found.items()):
            mma = sum(1 for l in lines if MMA.search(l))
            local = sum(1 for l in lines if LOCAL.search(l))
            name = demangled(function)
            opcodes = [m.group(1) for m in map(INSTRUCTION.search, lines) if m]
            trap_only = "BPT.TRAP" in opcodes and len([o for o in opcodes if o != "NOP"]) <= 8
            matched = [p.pattern for p in hot if p.search(function)]
            gap = any(p.search(function) for p in gaps)
            is_hot = bool(matched) and not trap_only and not gap
            label = name + (" (not built)" if trap_only else "") + (" (CUDA cores for now)" if gap else "")
            rows.append((arch, label, mma, local, is_hot))
            for pattern in matched:
                hot_per_arch[arch, pattern] += 0 if trap_only or gap else 1
            if is_hot:
                if mma == 0:
                    problems.append(f"{arch} {name}: no tensor-core instruction")
            for index, (kernel, want_arch, instruction) in enumerate(args.require):
                if arch != want_arch or not kernel.search(name):
                    continue
                required[index] += 1
                if not any(instruction.search(l) for l in lines):
                    problems.append(f"{arch} {name}: no {instruction.pattern} instruction")
            if local:
                problems.append(f"{arch} {demangled(function)}: {local} local-memory accesses")
    for arch in sorted(wanted):
        for pattern in args.tensor_core:
            if hot_per_arch[arch, pattern] == 0:
                problems.append(f"{arch}: no kernel matching {pattern!r} found")
    for index, (kernel, want_arch, instruction) in enumerate(args.require):
        if required[index] == 0:
            problems.append(f"{want_arch}: no kernel matching {kernel.pattern!r} found")
    print(f"{'arch':8} {'kernel':44} {'mma':>5} {'local':>5}")
    for arch, name, mma, local, is_hot in rows:
        print(f"{arch:8} {name + (' *' if is_hot else ''):44} {mma:5} {local:5}")
    print("* = must use the tensor cores")
    if problems:
        print("\n".join(["FAILED:"] + problems))
        sys.exit(1)
    print("SASS check passed")


if __name__ == "__main__":
    main()
