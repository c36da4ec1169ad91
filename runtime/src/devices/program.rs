//! A [`Policy`] as an eBPF program of type `BPF_PROG_TYPE_CGROUP_DEVICE`: the kernel runs it
//! on every open and mknod of a device node by a process in the cgroup, with a
//! `struct bpf_cgroup_dev_ctx { u32 access_type; u32 major; u32 minor; }` (`access_type` is
//! the access bits shifted left by 16 over the device type), and denies the operation when it
//! returns 0.
//!
//! The program is straight-line: load the request into r2-r5, then one block per exception
//! that jumps to the next block at the first field that does not match and otherwise returns
//! the exception's verdict; the last instruction returns the default. Only instructions every
//! kernel with cgroup device programs (4.15) verifies: 32-bit loads, 32-bit ALU, 64-bit
//! conditional jumps against immediates, exit.

use super::{Exception, Policy};

/// One eBPF instruction as the kernel reads it (`struct bpf_insn`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct Insn {
    pub code: u8,
    /// dst register in the low four bits, src in the high four.
    pub regs: u8,
    pub off: i16,
    pub imm: i32,
}

// Opcodes (linux/bpf_common.h, linux/bpf.h).
const LDX_MEM_W: u8 = 0x61; // BPF_LDX | BPF_MEM | BPF_W
const ALU32_AND_K: u8 = 0x54; // BPF_ALU | BPF_AND | BPF_K
const ALU32_RSH_K: u8 = 0x74; // BPF_ALU | BPF_RSH | BPF_K
const ALU32_MOV_X: u8 = 0xbc; // BPF_ALU | BPF_MOV | BPF_X
const ALU64_MOV_K: u8 = 0xb7; // BPF_ALU64 | BPF_MOV | BPF_K
const JMP_JEQ_K: u8 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
const JMP_JNE_K: u8 = 0x55; // BPF_JMP | BPF_JNE | BPF_K
const JMP_EXIT: u8 = 0x95; // BPF_JMP | BPF_EXIT

// Registers: r1 holds the context on entry and is scratch after the loads.
const R0: u8 = 0;
const R1: u8 = 1;
const TYPE: u8 = 2;
const ACCESS: u8 = 3;
const MAJOR: u8 = 4;
const MINOR: u8 = 5;

fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: (src << 4) | dst,
        off,
        imm,
    }
}

/// The program for `policy`.
pub fn compile(policy: &Policy) -> Vec<Insn> {
    let mut out = vec![
        insn(LDX_MEM_W, TYPE, R1, 0, 0),
        insn(ALU32_AND_K, TYPE, 0, 0, 0xffff),
        insn(LDX_MEM_W, ACCESS, R1, 0, 0),
        insn(ALU32_RSH_K, ACCESS, 0, 0, 16),
        insn(LDX_MEM_W, MAJOR, R1, 4, 0),
        insn(LDX_MEM_W, MINOR, R1, 8, 0),
    ];
    // Under deny, an exception grants; under allow, it denies.
    let verdict = i32::from(!policy.default_allow);
    for e in &policy.exceptions {
        out.extend(block(e, policy.default_allow, verdict));
    }
    out.push(insn(ALU64_MOV_K, R0, 0, 0, i32::from(policy.default_allow)));
    out.push(insn(JMP_EXIT, 0, 0, 0, 0));
    out
}

/// One exception's block: each test jumps past the rest of the block when it fails.
fn block(e: &Exception, default_allow: bool, verdict: i32) -> Vec<Insn> {
    // Tests as (instructions before the jump, the jump's opcode, register, immediate).
    let mut tests: Vec<(Vec<Insn>, u8, u8, i32)> = Vec::new();
    if let Some(kind) = e.kind {
        tests.push((vec![], JMP_JNE_K, TYPE, kind.bpf_type() as i32));
    }
    let scratch = vec![insn(ALU32_MOV_X, R1, ACCESS, 0, 0)];
    if default_allow {
        // any requested bit the exception lists: r1 = access & listed; skip if 0
        let mut pre = scratch;
        pre.push(insn(ALU32_AND_K, R1, 0, 0, e.access as i32));
        tests.push((pre, JMP_JEQ_K, R1, 0));
    } else {
        // every requested bit granted: r1 = access & !granted; skip unless 0
        let mut pre = scratch;
        pre.push(insn(ALU32_AND_K, R1, 0, 0, !(e.access as i32)));
        tests.push((pre, JMP_JNE_K, R1, 0));
    }
    if let Some(m) = e.major {
        tests.push((vec![], JMP_JNE_K, MAJOR, m as i32));
    }
    if let Some(m) = e.minor {
        tests.push((vec![], JMP_JNE_K, MINOR, m as i32));
    }
    let total: usize = tests.iter().map(|(pre, ..)| pre.len() + 1).sum::<usize>() + 2;
    let mut out = Vec::with_capacity(total);
    for (pre, op, reg, imm) in tests {
        out.extend(pre);
        // past the remaining instructions of this block
        let skip = total - out.len() - 1;
        out.push(insn(op, reg, 0, skip as i16, imm));
    }
    out.push(insn(ALU64_MOV_K, R0, 0, 0, verdict));
    out.push(insn(JMP_EXIT, 0, 0, 0, 0));
    out
}

/// Run a program on one request as the kernel would: what the unit tests check the compiled
/// form against [`Policy::allows`] with. Only the instructions [`compile`] emits.
#[cfg(test)]
pub(crate) fn interpret(prog: &[Insn], kind_type: u32, access: u8, major: u32, minor: u32) -> Result<bool, String> {
    let ctx = [((access as u32) << 16) | kind_type, major, minor];
    let mut r = [0u64; 11];
    let mut pc = 0usize;
    for _ in 0..4096 {
        let i = prog.get(pc).ok_or_else(|| format!("fell off the program at {pc}"))?;
        let (dst, src) = ((i.regs & 0xf) as usize, (i.regs >> 4) as usize);
        pc += 1;
        match i.code {
            LDX_MEM_W => {
                if src != 1 {
                    return Err(format!("load from r{src} at {}", pc - 1));
                }
                r[dst] = ctx[(i.off / 4) as usize] as u64;
            }
            ALU32_AND_K => r[dst] = (r[dst] as u32 & i.imm as u32) as u64,
            ALU32_RSH_K => r[dst] = ((r[dst] as u32) >> i.imm) as u64,
            ALU32_MOV_X => r[dst] = r[src] as u32 as u64,
            ALU64_MOV_K => r[dst] = i.imm as i64 as u64,
            JMP_JEQ_K | JMP_JNE_K => {
                let eq = r[dst] == i.imm as i64 as u64;
                if eq == (i.code == JMP_JEQ_K) {
                    pc = (pc as isize + i.off as isize) as usize;
                }
            }
            JMP_EXIT => return Ok(r[0] != 0),
            other => return Err(format!("opcode {other:#x} at {}", pc - 1)),
        }
    }
    Err("no exit".into())
}

#[cfg(test)]
mod tests {
    use super::super::*;
    use super::*;

    /// Every request the tests care about, against the policy's own answer.
    fn agrees(p: &Policy) {
        let prog = compile(p);
        for kind in [Kind::Block, Kind::Char] {
            for (major, minor) in [
                (1, 3),
                (1, 1),
                (5, 2),
                (136, 0),
                (136, 99),
                (8, 0),
                (254, 0),
                (10, 200),
                (0, 0),
            ] {
                for access in 1..=7u8 {
                    let want = p.allows(kind, major, minor, access);
                    let got = interpret(&prog, kind.bpf_type(), access, major, minor).unwrap();
                    assert_eq!(got, want, "{kind:?} {major}:{minor} access {access:03b} in {p:?}");
                }
            }
        }
    }

    #[test]
    fn the_program_answers_as_the_policy() {
        agrees(&Policy::from_rules(&default_rules()).unwrap());
        let mut rules = default_rules();
        rules.push(device_rule(Kind::Block, 254, 0, "rw"));
        rules.push(device_rule(Kind::Char, 1, 1, "r"));
        agrees(&Policy::from_rules(&rules).unwrap());
        let mut black = allow_all_rules();
        let mut d = device_rule(Kind::Block, 8, 0, "w");
        d.set_allow(false);
        black.push(d);
        let mut d = device_rule(Kind::Char, 136, 0, "rwm");
        d.set_allow(false);
        black.push(d);
        agrees(&Policy::from_rules(&black).unwrap());
        agrees(&Policy::from_rules(&allow_all_rules()).unwrap());
        agrees(&Policy {
            default_allow: false,
            exceptions: vec![],
        });
    }

    #[test]
    fn jumps_stay_inside_the_program() {
        let prog = compile(&Policy::from_rules(&default_rules()).unwrap());
        for (pc, i) in prog.iter().enumerate() {
            if i.code == JMP_JEQ_K || i.code == JMP_JNE_K {
                let to = pc as isize + 1 + i.off as isize;
                assert!(to > pc as isize && (to as usize) < prog.len(), "jump at {pc} to {to}");
            }
        }
        assert_eq!(prog.last().unwrap().code, JMP_EXIT);
    }
}
