// ext/core/src/elf_check.cpp: the loader rules of a CPU code object (docs/export-cpu.md section 4).
//
// The runtime dlopens a bundle's CPU code; glibc's loader trusts every table it reads and runs constructors,
// IFUNC resolvers and other libraries' code inside dlopen, before leapp could check anything. So the bundle
// parser reads the object's program headers, dynamic section, hash tables, symbols, versions and relocations
// from the bytes here and refuses what could run code at load, load a library no digest covers, or make the
// loader read outside the object. leapp/bundle/elf.py applies the same rules in the same order with the same
// words (a differential test compares them): a change here is a change there. Every sum below is of values
// first checked below 2^48 (or a u32), so none overflows a u64.
#include "elf_check.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "leapp/bundle_format.h"

namespace leapp::detail {
namespace {

constexpr uint64_t kMaxAddress = uint64_t(1) << 48;
constexpr uint64_t kMinAlign = 4096;
constexpr unsigned kMaxPhnum = 64;
constexpr uint64_t kMaxVersions = 256;
constexpr uint64_t kMaxFields = 4096;
constexpr uint64_t kMaxSymbols = 65536;  ///< symbols, hash buckets, bloom words, relocations
constexpr uint64_t kMaxDynamic = 4096;   ///< dynamic entries before DT_NULL, notes in a segment
constexpr uint64_t kMaxName = 4096;      ///< bytes of a name in the string table: each is scanned once
constexpr uint32_t kPfX = 1, kPfW = 2, kPfR = 4;
constexpr uint32_t kPtGnuStack = 0x6474e551, kPtGnuRelro = 0x6474e552;
constexpr uint64_t kDfTextrel = 0x4, kDfStaticTls = 0x10, kDfAllowed = 0x2 | 0x8, kDf1Allowed = 0x1 | 0x8;
constexpr uint64_t kDtGnuHash = 0x6ffffef5, kDtVersym = 0x6ffffff0, kDtRelacount = 0x6ffffff9,
                   kDtFlags1 = 0x6ffffffb, kDtVerdef = 0x6ffffffc, kDtVerdefnum = 0x6ffffffd,
                   kDtVerneed = 0x6ffffffe, kDtVerneednum = 0x6fffffff;
constexpr const char* kAllowedNeeded[] = {"libc.so.6", "libm.so.6"};

struct Refused {
  std::string why;
};
[[noreturn]] void fail(std::string why) { throw Refused{std::move(why)}; }

std::string dec(uint64_t v) { return std::to_string(v); }
std::string hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%llx", static_cast<unsigned long long>(v));
  return std::string("0x") + buf;
}

/// A name for a message: at most 60 bytes, anything but printable ASCII (and a backslash or a quote) as \xNN.
std::string shown_name(std::string_view name) {
  std::string out;
  for (size_t i = 0; i < name.size() && i < 60; ++i) {
    const unsigned char c = static_cast<unsigned char>(name[i]);
    if (c >= 0x20 && c < 0x7f && c != 0x5c && c != 0x27) {
      out += char(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  return name.size() > 60 ? out + "..." : out;
}

const char* pt_name(uint32_t t) {
  switch (t) {
    case 0: return "PT_NULL";
    case 1: return "PT_LOAD";
    case 2: return "PT_DYNAMIC";
    case 3: return "PT_INTERP";
    case 4: return "PT_NOTE";
    case 6: return "PT_PHDR";
    case 7: return "PT_TLS";
    case 0x6474e550: return "PT_GNU_EH_FRAME";
    case kPtGnuStack: return "PT_GNU_STACK";
    case kPtGnuRelro: return "PT_GNU_RELRO";
    case 0x6474e553: return "PT_GNU_PROPERTY";
    default: return nullptr;
  }
}
bool pt_allowed(uint32_t t) { return pt_name(t) != nullptr && t != 3 && t != 7; }
bool pt_in_file_part(uint32_t t) { return t == 2 || t == 4 || t == 6 || t == 0x6474e550 || t == 0x6474e553; }

const char* dt_name(uint64_t t) {
  static const std::map<uint64_t, const char*> names = {
      {0, "DT_NULL"}, {1, "DT_NEEDED"}, {2, "DT_PLTRELSZ"}, {3, "DT_PLTGOT"}, {4, "DT_HASH"}, {5, "DT_STRTAB"},
      {6, "DT_SYMTAB"}, {7, "DT_RELA"}, {8, "DT_RELASZ"}, {9, "DT_RELAENT"}, {10, "DT_STRSZ"}, {11, "DT_SYMENT"},
      {14, "DT_SONAME"}, {16, "DT_SYMBOLIC"}, {20, "DT_PLTREL"}, {21, "DT_DEBUG"}, {23, "DT_JMPREL"},
      {24, "DT_BIND_NOW"}, {30, "DT_FLAGS"}, {kDtGnuHash, "DT_GNU_HASH"}, {kDtVersym, "DT_VERSYM"},
      {kDtRelacount, "DT_RELACOUNT"}, {kDtFlags1, "DT_FLAGS_1"}, {kDtVerdef, "DT_VERDEF"},
      {kDtVerdefnum, "DT_VERDEFNUM"}, {kDtVerneed, "DT_VERNEED"}, {kDtVerneednum, "DT_VERNEEDNUM"}};
  auto it = names.find(t);
  return it == names.end() ? nullptr : it->second;
}

/// A refused tag's name and why ({nullptr, nullptr} when the tag is not refused by name).
std::pair<const char*, const char*> dt_refused(uint64_t t) {
  const char* rel = "REL relocations: this machine uses RELA";
  const char* relr = "packed relocations, which leapp does not emit";
  switch (t) {
    case 12: return {"DT_INIT", "code run at load"};
    case 13: return {"DT_FINI", "code run at unload"};
    case 15: return {"DT_RPATH", "a library search path"};
    case 17: return {"DT_REL", rel};
    case 18: return {"DT_RELSZ", rel};
    case 19: return {"DT_RELENT", rel};
    case 22: return {"DT_TEXTREL", "relocations of read-only code"};
    case 25: return {"DT_INIT_ARRAY", "code run at load"};
    case 26: return {"DT_FINI_ARRAY", "code run at unload"};
    case 27: return {"DT_INIT_ARRAYSZ", "code run at load"};
    case 28: return {"DT_FINI_ARRAYSZ", "code run at unload"};
    case 29: return {"DT_RUNPATH", "a library search path"};
    case 32: return {"DT_PREINIT_ARRAY", "code run at load"};
    case 33: return {"DT_PREINIT_ARRAYSZ", "code run at load"};
    case 35: return {"DT_RELRSZ", relr};
    case 36: return {"DT_RELR", relr};
    case 37: return {"DT_RELRENT", relr};
    case 0x6ffffefb: return {"DT_DEPAUDIT", "an audit library"};
    case 0x6ffffefc: return {"DT_AUDIT", "an audit library"};
    case 0x7ffffffd: return {"DT_AUXILIARY", "a filter library"};
    case 0x7fffffff: return {"DT_FILTER", "a filter library"};
    default: return {nullptr, nullptr};
  }
}

struct Relocs {
  std::map<uint32_t, const char*> allowed, tls;
  uint32_t irelative, relative;
  const char* irelative_name;
};
const Relocs& relocs_of(uint16_t machine) {
  static const Relocs x86{{{0, "R_X86_64_NONE"}, {1, "R_X86_64_64"}, {6, "R_X86_64_GLOB_DAT"},
                           {7, "R_X86_64_JUMP_SLOT"}, {8, "R_X86_64_RELATIVE"}},
                          {{16, "R_X86_64_DTPMOD64"}, {17, "R_X86_64_DTPOFF64"}, {18, "R_X86_64_TPOFF64"},
                           {19, "R_X86_64_TLSGD"}, {20, "R_X86_64_TLSLD"}, {21, "R_X86_64_DTPOFF32"},
                           {22, "R_X86_64_GOTTPOFF"}, {23, "R_X86_64_TPOFF32"}, {36, "R_X86_64_TLSDESC"}},
                          37, 8, "R_X86_64_IRELATIVE"};
  static const Relocs arm{{{0, "R_AARCH64_NONE"}, {257, "R_AARCH64_ABS64"}, {1025, "R_AARCH64_GLOB_DAT"},
                           {1026, "R_AARCH64_JUMP_SLOT"}, {1027, "R_AARCH64_RELATIVE"}},
                          {{1028, "R_AARCH64_TLS_DTPMOD"}, {1029, "R_AARCH64_TLS_DTPREL"},
                           {1030, "R_AARCH64_TLS_TPREL"}, {1031, "R_AARCH64_TLSDESC"}},
                          1032, 1027, "R_AARCH64_IRELATIVE"};
  return machine == kElfMachineX86_64 ? x86 : arm;
}

struct Load {
  uint32_t flags;
  uint64_t offset, vaddr, filesz, memsz, align;
};
struct Sym {
  uint32_t name;
  uint8_t info;
  uint16_t shndx;
  uint64_t value, size;
};

uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

class Check {
 public:
  Check(std::string_view data, uint16_t elf_machine, const std::string& machine,
        const std::vector<std::string>& entries)
      : d_(data), elf_machine_(elf_machine), machine_(machine), entries_(entries) {}

  void run();

 private:
  uint64_t u16(uint64_t off) const { return uint64_t(b(off)) | uint64_t(b(off + 1)) << 8; }
  uint64_t u32(uint64_t off) const { return u16(off) | u16(off + 2) << 16; }
  uint64_t u64(uint64_t off) const { return u32(off) | u32(off + 4) << 32; }
  unsigned b(uint64_t off) const { return static_cast<unsigned char>(d_[off]); }

  bool has(uint64_t tag) const { return tags_.count(tag) != 0; }

  /// The file offset of [vaddr, vaddr + n), which must lie in the file part of one PT_LOAD (of the kind asked:
  /// `writable`/`executable` -1 for either).
  uint64_t file_part(uint64_t vaddr, uint64_t n, const std::string& what, int writable = -1, int executable = -1,
                     const char* kind = "a PT_LOAD") const {
    for (const Load& l : loads_) {
      if (l.vaddr <= vaddr && n <= l.filesz && vaddr - l.vaddr <= l.filesz - n) {
        if ((writable < 0 || bool(l.flags & kPfW) == bool(writable)) &&
            (executable < 0 || bool(l.flags & kPfX) == bool(executable)))
          return l.offset + (vaddr - l.vaddr);
        break;
      }
    }
    fail(what + " [" + hex(vaddr) + ", +" + dec(n) + ") does not lie inside the file part of " + kind);
  }

  const Load* in_memory(uint64_t vaddr, uint64_t n) const {
    for (const Load& l : loads_)
      if (l.vaddr <= vaddr && n <= l.memsz && vaddr - l.vaddr <= l.memsz - n) return &l;
    return nullptr;
  }

  /// A table the loader reads: in a non-writable PT_LOAD's file part, where no relocation can change it.
  uint64_t table(uint64_t vaddr, uint64_t n, const std::string& what) const {
    if (vaddr >= kMaxAddress || n >= kMaxAddress)
      fail(what + " [" + hex(vaddr) + ", +" + dec(n) + ") does not lie inside the file part of a non-writable PT_LOAD");
    return file_part(vaddr, n, what, 0, -1, "a non-writable PT_LOAD");
  }

  std::string_view string(uint64_t off, const std::string& what) const {
    if (off >= strsz_)
      fail(what + ": name offset " + dec(off) + " lies outside the " + dec(strsz_) + "-byte string table");
    const char* start = d_.data() + strtab_ + off;
    const void* end = std::memchr(start, 0, std::min<uint64_t>(kMaxName + 1, strsz_ - off));
    if (!end) fail(what + ": the name at offset " + dec(off) + " is longer than " + dec(kMaxName) + " bytes");
    return std::string_view(start, size_t(static_cast<const char*>(end) - start));
  }

  uint64_t need(uint64_t tag) const {
    auto it = tags_.find(tag);
    if (it == tags_.end()) fail(std::string("dynamic section: no ") + dt_name(tag));
    return it->second;
  }

  void program_headers(uint64_t phoff, unsigned phnum);
  /// Each note glibc walks (its header starts before the end) ends inside the segment.
  void notes(uint64_t base, uint64_t size, uint64_t align, const std::string& where) const {
    for (uint64_t at = 0, notes = 1; at + 12 < size; ++notes) {
      if (notes > kMaxDynamic) fail(where + ": more than " + dec(kMaxDynamic) + " notes");
      const uint64_t namesz = u32(base + at), descsz = u32(base + at + 4);
      const uint64_t end = round_up(at + 12 + namesz, align) + descsz;
      if (end > size)
        fail(where + ": the note at +" + dec(at) + " ends at +" + dec(end) + ", past its " + dec(size) + " bytes");
      at = round_up(end, align);
    }
  }
  void dynamic_section();
  void strings();
  void symbols_and_hashes();
  uint64_t gnu_hash(uint64_t vaddr);
  uint64_t sysv_hash(uint64_t vaddr);
  void versions();
  std::vector<uint64_t> defined(std::string_view name) const;
  void entry_points();
  void relocations();

  std::string_view d_;
  uint16_t elf_machine_;
  std::string machine_;
  const std::vector<std::string>& entries_;
  std::vector<Load> loads_;
  uint64_t dyn_vaddr_ = 0, dyn_size_ = 0;
  std::map<uint64_t, uint64_t> tags_;
  std::vector<std::pair<uint64_t, uint64_t>> needed_;  // (entry, name offset)
  std::set<std::string_view> needed_names_;
  uint64_t strtab_ = 0, strsz_ = 0, count_ = 0;
  std::vector<Sym> syms_;
  std::vector<std::string_view> names_;
  std::map<std::string_view, std::vector<uint64_t>> by_name_;  // the defined symbols of each name
};

void Check::run() {
  const uint64_t size = d_.size();
  if (size > kBundleMaxCpuCodeBytes)
    fail("the object has " + dec(size) + " bytes, more than " + dec(kBundleMaxCpuCodeBytes) + " (64 MiB)");
  const std::string problem = elf_problem(d_, elf_machine_, machine_);
  if (!problem.empty()) fail(problem);
  if (b(6) != 1) fail("ELF EI_VERSION " + dec(b(6)) + " is not 1");
  const uint64_t phoff = u64(32), phentsize = u16(54), phnum = u16(56);
  if (phentsize != 56) fail("ELF e_phentsize " + dec(phentsize) + " is not 56");
  if (phnum < 1 || phnum > kMaxPhnum) fail("ELF e_phnum " + dec(phnum) + " is not in [1, " + dec(kMaxPhnum) + "]");
  if (phoff > size || phnum * 56 > size - phoff)
    fail("the program header table [" + dec(phoff) + ", +" + dec(phnum * 56) + ") lies outside the " + dec(size) +
         "-byte file");
  program_headers(phoff, unsigned(phnum));
  dynamic_section();
  strings();
  symbols_and_hashes();
  versions();
  entry_points();
  relocations();
}

void Check::program_headers(uint64_t phoff, unsigned phnum) {
  const uint64_t size = d_.size();
  struct Ph {
    uint32_t type, flags;
    uint64_t offset, vaddr, filesz, memsz, align;
  };
  std::vector<Ph> hs;
  for (unsigned i = 0; i < phnum; ++i) {
    const uint64_t o = phoff + 56 * uint64_t(i);
    hs.push_back({uint32_t(u32(o)), uint32_t(u32(o + 4)), u64(o + 8), u64(o + 16), u64(o + 32), u64(o + 40),
                  u64(o + 48)});
  }
  long dynamic = -1, stack = -1;
  for (unsigned i = 0; i < phnum; ++i) {
    const Ph& h = hs[i];
    const char* known = pt_name(h.type);
    const std::string name = known ? known : "type " + hex(h.type);
    const std::string where = "program header " + dec(i) + " (" + name + ")";
    if (h.type == 3 || h.type == 7)
      fail("program header " + dec(i) + ": " + name + " (" +
           (h.type == 3 ? "a program interpreter" : "thread-local storage") + ") is not allowed");
    if (!pt_allowed(h.type)) fail("program header " + dec(i) + ": type " + hex(h.type) + " is not allowed");
    if (h.type == 0) continue;
    if (h.offset > size || h.filesz > size - h.offset)
      fail(where + ": its file range [" + dec(h.offset) + ", +" + dec(h.filesz) + ") lies outside the " + dec(size) +
           "-byte file");
    if (h.vaddr >= kMaxAddress || h.memsz >= kMaxAddress - h.vaddr)
      fail(where + ": p_vaddr " + hex(h.vaddr) + " + p_memsz " + hex(h.memsz) + " is not below 2^48");
    if (h.filesz > h.memsz) fail(where + ": p_filesz " + dec(h.filesz) + " exceeds p_memsz " + dec(h.memsz));
    if (h.type == kPtGnuStack) {
      if (h.flags & kPfX) fail(where + ": the object asks for an executable stack");
      stack = long(i);
    }
    if (h.type == 2) {
      if (dynamic >= 0) fail(where + ": a second PT_DYNAMIC (first: program header " + dec(uint64_t(dynamic)) + ")");
      dynamic = long(i);
    }
    if (h.type != 1) continue;
    if (h.align < kMinAlign || h.align > kElfMaxLoadSpan || (h.align & (h.align - 1)))
      fail(where + ": p_align " + dec(h.align) + " is not a power of two in [" + dec(kMinAlign) + ", " +
           dec(kElfMaxLoadSpan) + "]");
    if (h.vaddr % h.align != h.offset % h.align)
      fail(where + ": p_vaddr " + hex(h.vaddr) + " and p_offset " + hex(h.offset) + " differ modulo p_align " +
           dec(h.align));
    if (!(h.flags & kPfR) || (h.flags & ~(kPfR | kPfW | kPfX)))
      fail(where + ": p_flags " + hex(h.flags) + " is not PF_R, with PF_W or PF_X at most (the loader reads it)");
    if ((h.flags & kPfW) && (h.flags & kPfX)) fail(where + ": a segment both writable and executable");
    if (!loads_.empty()) {
      const Load& prev = loads_.back();
      const uint64_t end = round_up(prev.vaddr + prev.memsz, prev.align);
      if (h.vaddr / h.align * h.align < end)
        fail(where + ": p_vaddr " + hex(h.vaddr) + " is not past the pages of the previous PT_LOAD (which end at " +
             hex(end) + ")");
    }
    loads_.push_back({h.flags, h.offset, h.vaddr, h.filesz, h.memsz, h.align});
  }
  if (loads_.empty()) fail("no PT_LOAD program header");
  const Load &first = loads_.front(), &last = loads_.back();
  const uint64_t span = round_up(last.vaddr + last.memsz, last.align) - first.vaddr / first.align * first.align;
  if (span > kElfMaxLoadSpan)
    fail("the PT_LOAD segments span " + dec(span) + " bytes, more than " + dec(kElfMaxLoadSpan) + " (256 MiB)");
  if (dynamic < 0) fail("no PT_DYNAMIC program header");
  if (stack < 0) fail("no PT_GNU_STACK program header (the loader would make the stack executable)");
  for (unsigned i = 0; i < phnum; ++i) {
    const Ph& h = hs[i];
    const std::string where = "program header " + dec(i) + " (" + pt_name(h.type) + ")";
    if (pt_in_file_part(h.type)) {
      const uint64_t base = file_part(h.vaddr, h.memsz, where);
      if ((h.type == 4 || h.type == 0x6474e553) && (h.align == 4 || h.align == 8))  // glibc reads these notes
        notes(base, h.memsz, h.align, where);
      if (h.type == 6 && !(base == phoff && h.offset == phoff && h.filesz == 56 * uint64_t(phnum) &&
                           h.memsz == 56 * uint64_t(phnum)))
        fail(where + ": [" + hex(h.vaddr) + ", +" + dec(h.memsz) + ") is not the program header table [" + dec(phoff) +
             ", +" + dec(56 * uint64_t(phnum)) + ") itself (the unwinder reads the table there)");
    } else if (h.type == kPtGnuRelro) {
      const Load* l = in_memory(h.vaddr, h.memsz);
      if (!l || !(l->flags & kPfW))
        fail(where + " [" + hex(h.vaddr) + ", +" + dec(h.memsz) + ") does not lie inside a writable PT_LOAD");
    }
  }
  dyn_vaddr_ = hs[size_t(dynamic)].vaddr;
  dyn_size_ = hs[size_t(dynamic)].filesz;
}

void Check::dynamic_section() {
  const uint64_t base = file_part(dyn_vaddr_, dyn_size_, "PT_DYNAMIC");
  for (uint64_t j = 0;; ++j) {
    if (16 * j + 16 > dyn_size_) fail("dynamic section: no DT_NULL within its " + dec(dyn_size_) + " bytes");
    if (j == kMaxDynamic) fail("dynamic section: more than " + dec(kMaxDynamic) + " entries before DT_NULL");
    const uint64_t tag = u64(base + 16 * j), value = u64(base + 16 * j + 8);
    if (tag == 0) break;
    const std::string where = "dynamic entry " + dec(j);
    const auto refused = dt_refused(tag);
    if (refused.first) fail(where + ": " + refused.first + " (" + refused.second + ") is not allowed");
    if (!dt_name(tag)) fail(where + ": tag " + hex(tag) + " is not allowed");
    if (tag == 1)
      needed_.emplace_back(j, value);
    else if (has(tag))
      fail(where + ": a second " + dt_name(tag));
    else
      tags_[tag] = value;
    if (tag == 30) {
      if (value & kDfStaticTls) fail(where + ": DT_FLAGS has DF_STATIC_TLS (thread-local storage)");
      if (value & kDfTextrel) fail(where + ": DT_FLAGS has DF_TEXTREL (relocations of read-only code)");
      if (value & ~kDfAllowed) fail(where + ": DT_FLAGS has flags " + hex(value & ~kDfAllowed) + ", which are not allowed");
    }
    if (tag == kDtFlags1 && (value & ~kDf1Allowed))
      fail(where + ": DT_FLAGS_1 has flags " + hex(value & ~kDf1Allowed) + ", which are not allowed");
  }
}

void Check::strings() {
  const uint64_t vaddr = need(5);
  strsz_ = need(10);
  strtab_ = table(vaddr, strsz_, "DT_STRTAB");
  if (strsz_ == 0 || d_[strtab_ + strsz_ - 1] != '\0')
    fail("dynamic section: the string table (DT_STRTAB) does not end with a NUL byte");
  for (const auto& [j, off] : needed_) {
    const std::string_view name = string(off, "dynamic entry " + dec(j) + " (DT_NEEDED)");
    bool ok = false;
    for (const char* allowed : kAllowedNeeded) ok = ok || name == allowed;
    if (!ok)
      fail("dynamic entry " + dec(j) + ": DT_NEEDED '" + shown_name(name) +
           "' is not one of the C runtime's libraries (libc.so.6, libm.so.6)");
    needed_names_.insert(name);
  }
  if (has(14)) string(tags_[14], "DT_SONAME");
}

void Check::symbols_and_hashes() {
  const uint64_t symtab = need(6);
  if (has(11) && tags_[11] != 24) fail("dynamic section: DT_SYMENT " + dec(tags_[11]) + " is not 24");
  if (!has(4) && !has(kDtGnuHash)) fail("dynamic section: neither DT_HASH nor DT_GNU_HASH");
  uint64_t count = 0;
  if (has(kDtGnuHash)) count = gnu_hash(tags_[kDtGnuHash]);
  if (has(4)) count = std::max(count, sysv_hash(tags_[4]));
  count_ = count;
  const uint64_t base = table(symtab, 24 * count, "DT_SYMTAB (" + dec(count) + " symbols)");
  syms_.reserve(count);
  for (uint64_t s = 0; s < count; ++s) {
    const uint64_t o = base + 24 * s;
    syms_.push_back({uint32_t(u32(o)), uint8_t(b(o + 4)), uint16_t(u16(o + 6)), u64(o + 8), u64(o + 16)});
  }
  for (uint64_t s = 0; s < count; ++s) {
    const std::string_view name = string(syms_[s].name, "symbol " + dec(s));
    names_.push_back(name);
    if (syms_[s].shndx != 0) by_name_[name].push_back(s);
    const unsigned type = syms_[s].info & 0xf;
    if (type == 10)
      fail("symbol " + dec(s) + " '" + shown_name(name) + "': STT_GNU_IFUNC (an IFUNC resolver) is not allowed");
    if (type == 6) fail("symbol " + dec(s) + " '" + shown_name(name) + "': STT_TLS (thread-local storage) is not allowed");
  }
}

uint64_t Check::gnu_hash(uint64_t vaddr) {
  uint64_t head = table(vaddr, 16, "DT_GNU_HASH");
  const uint64_t nbuckets = u32(head), symoffset = u32(head + 4), bloom = u32(head + 8), shift = u32(head + 12);
  if (nbuckets < 1 || nbuckets > kMaxSymbols)
    fail("DT_GNU_HASH: nbuckets " + dec(nbuckets) + " is not in [1, " + dec(kMaxSymbols) + "]");
  if (bloom == 0 || (bloom & (bloom - 1)) || bloom > kMaxSymbols)
    fail("DT_GNU_HASH: the bloom filter's size " + dec(bloom) + " is not a power of two in [1, " + dec(kMaxSymbols) +
         "]");
  if (symoffset > kMaxSymbols)
    fail("DT_GNU_HASH: symoffset " + dec(symoffset) + " is more than " + dec(kMaxSymbols));
  if (shift >= 32) fail("DT_GNU_HASH: the bloom shift " + dec(shift) + " is not below 32");
  head = table(vaddr, 16 + 8 * bloom + 4 * nbuckets, "DT_GNU_HASH");
  const uint64_t buckets = head + 16 + 8 * bloom;
  uint64_t top = 0;
  long top_bucket = -1;
  for (uint64_t k = 0; k < nbuckets; ++k) {
    const uint64_t v = u32(buckets + 4 * k);
    if (v != 0 && v < symoffset)
      fail("DT_GNU_HASH: bucket " + dec(k) + " starts at symbol " + dec(v) + ", below symoffset " + dec(symoffset));
    if (v > top) top = v, top_bucket = long(k);
  }
  if (top_bucket < 0) return symoffset;
  const uint64_t chains = vaddr + 16 + 8 * bloom + 4 * nbuckets;
  const std::string runs_out = "DT_GNU_HASH: the chain of bucket " + dec(uint64_t(top_bucket)) + " runs out of its PT_LOAD";
  for (uint64_t index = top;; ++index) {  // every chain ends at the first end bit at or after its start
    if (index >= kMaxSymbols)
      fail("DT_GNU_HASH: the chain of bucket " + dec(uint64_t(top_bucket)) + " runs past " + dec(kMaxSymbols) +
           " symbols");
    const uint64_t at = chains + 4 * (index - symoffset);
    uint64_t off = 0;
    try {
      off = table(at, 4, "DT_GNU_HASH chain");
    } catch (const Refused&) {
      fail(runs_out);
    }
    if (u32(off) & 1) return std::max(symoffset, index + 1);
  }
}

uint64_t Check::sysv_hash(uint64_t vaddr) {
  uint64_t head = table(vaddr, 8, "DT_HASH");
  const uint64_t nbucket = u32(head), nchain = u32(head + 4);
  if (nbucket > kMaxSymbols || nchain > kMaxSymbols)
    fail("DT_HASH: nbucket " + dec(nbucket) + " or nchain " + dec(nchain) + " is more than " + dec(kMaxSymbols));
  head = table(vaddr, 8 + 4 * (nbucket + nchain), "DT_HASH");
  const uint64_t chain = head + 8 + 4 * nbucket;
  std::vector<bool> seen(nchain, false);
  for (uint64_t k = 0; k < nbucket; ++k) {
    for (uint64_t index = u32(head + 8 + 4 * k); index != 0; index = u32(chain + 4 * index)) {
      if (index >= nchain)
        fail("DT_HASH: bucket " + dec(k) + " reaches symbol " + dec(index) + ", past nchain " + dec(nchain));
      if (seen[index])
        fail("DT_HASH: bucket " + dec(k) + "'s chain meets another chain or loops at symbol " + dec(index));
      seen[index] = true;
    }
  }
  return nchain;
}

void Check::versions() {
  uint64_t high = 0;
  if (has(kDtVerneed) != has(kDtVerneednum)) fail("dynamic section: DT_VERNEED and DT_VERNEEDNUM go together");
  if (has(kDtVerdef) != has(kDtVerdefnum)) fail("dynamic section: DT_VERDEF and DT_VERDEFNUM go together");
  if ((has(kDtVerneed) || has(kDtVerdef)) && !has(kDtVersym))
    fail("dynamic section: DT_VERNEED or DT_VERDEF without DT_VERSYM (glibc reads it regardless)");
  if (has(kDtVerneed)) {
    uint64_t vaddr = tags_[kDtVerneed];
    const uint64_t num = tags_[kDtVerneednum];
    if (num < 1 || num > kMaxVersions)
      fail("dynamic section: DT_VERNEEDNUM " + dec(num) + " is not in [1, " + dec(kMaxVersions) + "]");
    for (uint64_t n = 0; n < num; ++n) {
      const std::string where = "DT_VERNEED entry " + dec(n);
      const uint64_t off = table(vaddr, 16, where);
      const uint64_t version = u16(off), cnt = u16(off + 2), file = u32(off + 4), aux = u32(off + 8),
                     next = u32(off + 12);
      if (version != 1) fail(where + ": vn_version " + dec(version) + " is not 1");
      const std::string_view name = string(file, where);
      if (!needed_names_.count(name))
        fail(where + ": file '" + shown_name(name) + "' is not one of the object's DT_NEEDED");
      if (cnt < 1 || cnt > kMaxVersions)
        fail(where + ": vn_cnt " + dec(cnt) + " is not in [1, " + dec(kMaxVersions) + "]");
      uint64_t at = vaddr + aux;
      for (uint64_t a = 0; a < cnt; ++a) {
        const std::string awhere = where + " name " + dec(a);
        const uint64_t aoff = table(at, 16, awhere);
        const uint64_t other = u16(aoff + 6), aname = u32(aoff + 8), anext = u32(aoff + 12);
        string(aname, awhere);
        high = std::max(high, other & 0x7fff);
        if ((anext == 0) != (a == cnt - 1)) fail(where + ": its names' links do not match vn_cnt " + dec(cnt));
        at += anext;
      }
      if ((next == 0) != (n == num - 1))
        fail(where + ": the entries' links do not match DT_VERNEEDNUM " + dec(num));
      vaddr += next;
    }
  }
  if (has(kDtVerdef)) {
    uint64_t vaddr = tags_[kDtVerdef];
    const uint64_t num = tags_[kDtVerdefnum];
    if (num < 1 || num > kMaxVersions)
      fail("dynamic section: DT_VERDEFNUM " + dec(num) + " is not in [1, " + dec(kMaxVersions) + "]");
    for (uint64_t n = 0; n < num; ++n) {
      const std::string where = "DT_VERDEF entry " + dec(n);
      const uint64_t off = table(vaddr, 20, where);
      const uint64_t version = u16(off), ndx = u16(off + 4), cnt = u16(off + 6), aux = u32(off + 12),
                     next = u32(off + 16);
      if (version != 1) fail(where + ": vd_version " + dec(version) + " is not 1");
      if (cnt < 1 || cnt > kMaxVersions)
        fail(where + ": vd_cnt " + dec(cnt) + " is not in [1, " + dec(kMaxVersions) + "]");
      high = std::max(high, ndx & 0x7fff);
      uint64_t at = vaddr + aux;
      for (uint64_t a = 0; a < cnt; ++a) {
        const std::string awhere = where + " name " + dec(a);
        const uint64_t aoff = table(at, 8, awhere);
        const uint64_t aname = u32(aoff), anext = u32(aoff + 4);
        string(aname, awhere);
        if ((anext == 0) != (a == cnt - 1)) fail(where + ": its names' links do not match vd_cnt " + dec(cnt));
        at += anext;
      }
      if ((next == 0) != (n == num - 1)) fail(where + ": the entries' links do not match DT_VERDEFNUM " + dec(num));
      vaddr += next;
    }
  }
  if (has(kDtVersym)) {
    if (high == 0) fail("dynamic section: DT_VERSYM without a version (no DT_VERNEED or DT_VERDEF index)");
    const uint64_t off = table(tags_[kDtVersym], 2 * count_, "DT_VERSYM (" + dec(count_) + " symbols)");
    for (uint64_t s = 0; s < count_; ++s) {
      const uint64_t v = u16(off + 2 * s) & 0x7fff;
      if (v > high)
        fail("DT_VERSYM entry " + dec(s) + ": version index " + dec(v) + " is not defined (the highest is " +
             dec(high) + ")");
    }
  }
}

std::vector<uint64_t> Check::defined(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? std::vector<uint64_t>{} : it->second;
}

void Check::entry_points() {
  std::set<std::string> seen;
  for (size_t k = 0; k < entries_.size(); ++k) {
    const std::string& entry = entries_[k];
    if (!seen.insert(entry).second) continue;
    const std::string where = "kernels[" + dec(k) + "] CPU entry '" + shown_name(entry) + "'";
    std::vector<uint64_t> found = defined(entry);
    if (found.empty()) fail(where + ": not defined by the CPU code");
    if (found.size() > 1)
      fail(where + ": defined twice by the CPU code (symbols " + dec(found[0]) + " and " + dec(found[1]) + ")");
    const Sym& e = syms_[found[0]];
    if ((e.info & 0xf) != 2)
      fail(where + ": symbol " + dec(found[0]) + " is not a function (type " + dec(e.info & 0xf) + ")");
    if (e.shndx >= 0xff00 || e.size == 0)
      fail(where + ": symbol " + dec(found[0]) + " has section index " + hex(e.shndx) + " and size " + dec(e.size));
    file_part(e.value, e.size, where + ": its code", -1, 1, "an executable PT_LOAD");
    const std::string table_name = entry + "_leapp_args";
    const std::string twhere = where + ": its layout table '" + shown_name(table_name) + "'";
    found = defined(table_name);
    if (found.empty()) fail(twhere + " is not defined by the CPU code");
    if (found.size() > 1)
      fail(twhere + " is defined twice (symbols " + dec(found[0]) + " and " + dec(found[1]) + ")");
    const Sym& t = syms_[found[0]];
    if ((t.info & 0xf) != 1 || t.shndx >= 0xff00)
      fail(twhere + ": symbol " + dec(found[0]) + " is not a data object (type " + dec(t.info & 0xf) +
           ", section index " + hex(t.shndx) + ")");
    if (t.size < 24) fail(twhere + " has " + dec(t.size) + " bytes, fewer than 24");
    // read-only: no relocation (their targets are writable) can change it after the check
    const uint64_t off = file_part(t.value, t.size, twhere, 0, 0, "a read-only, non-executable PT_LOAD");
    const uint64_t fields = u64(off);
    if (fields > kMaxFields)
      fail(twhere + " declares " + dec(fields) + " arguments, more than " + dec(kMaxFields));
    if (t.size < 8 * (3 + 2 * fields))
      fail(twhere + " has " + dec(t.size) + " bytes, fewer than the " + dec(8 * (3 + 2 * fields)) + " its " +
           dec(fields) + " arguments need");
  }
}

/// Each relocation's type, symbol and target: a writable PT_LOAD, so never code, a layout table or a table the
/// loader reads (all in non-writable ones), and never the dynamic section.
void Check::relocations() {
  const Relocs& r = relocs_of(elf_machine_);
  if (has(9) && tags_[9] != 24) fail("dynamic section: DT_RELAENT " + dec(tags_[9]) + " is not 24");
  if (has(7) != has(8)) fail("dynamic section: DT_RELA and DT_RELASZ go together");
  if (has(23) != has(2) || has(23) != has(20))
    fail("dynamic section: DT_JMPREL, DT_PLTRELSZ and DT_PLTREL go together");
  if (has(20) && tags_[20] != 7) fail("dynamic section: DT_PLTREL " + dec(tags_[20]) + " is not DT_RELA (7)");
  if (has(3)) {
    const Load* l = tags_[3] < kMaxAddress ? in_memory(tags_[3], 24) : nullptr;
    if (!l || !(l->flags & kPfW))
      fail("dynamic section: DT_PLTGOT " + hex(tags_[3]) + " does not lie inside a writable PT_LOAD");
  }
  const uint64_t relative_count = has(kDtRelacount) ? tags_[kDtRelacount] : 0;
  if (relative_count && !has(7)) fail("dynamic section: DT_RELACOUNT without DT_RELA");
  const struct {
    const char* name;
    uint64_t where_tag, size_tag;
  } tables[] = {{"DT_RELA", 7, 8}, {"DT_JMPREL", 23, 2}};
  for (const auto& tb : tables) {
    if (!has(tb.where_tag)) continue;
    const uint64_t size = tags_[tb.size_tag];
    const bool rela = tb.where_tag == 7;
    if (size % 24) fail(std::string("dynamic section: ") + dt_name(tb.size_tag) + " " + dec(size) + " is not a multiple of 24");
    if (size / 24 > kMaxSymbols)
      fail(std::string("dynamic section: ") + dt_name(tb.size_tag) + " " + dec(size) + " holds more than " +
           dec(kMaxSymbols) + " relocations");
    const uint64_t base = table(tags_[tb.where_tag], size, tb.name);
    if (rela && relative_count > size / 24)
      fail("dynamic section: DT_RELACOUNT " + dec(relative_count) + " exceeds the " + dec(size / 24) +
           " DT_RELA entries");
    for (uint64_t i = 0; i < size / 24; ++i) {
      const uint64_t offset = u64(base + 24 * i), info = u64(base + 24 * i + 8);
      const uint64_t kind = info & 0xffffffffu, sym = info >> 32;
      const std::string where = std::string(tb.name) + " entry " + dec(i);
      if (kind == r.irelative) fail(where + ": " + r.irelative_name + " (an IFUNC relocation) is not allowed");
      if (auto it = r.tls.find(uint32_t(kind)); it != r.tls.end())
        fail(where + ": " + it->second + " (a TLS relocation) is not allowed");
      if (!r.allowed.count(uint32_t(kind)))
        fail(where + ": relocation type " + dec(kind) + " is not allowed for " + machine_);
      if (rela && i < relative_count && kind != r.relative)
        fail(where + ": one of the DT_RELACOUNT first entries, but not " + r.allowed.at(r.relative));
      if (sym >= count_) fail(where + ": symbol index " + dec(sym) + " is out of range (" + dec(count_) + " symbols)");
      const Load* l = offset < kMaxAddress ? in_memory(offset, 8) : nullptr;
      if (!l || !(l->flags & kPfW))
        fail(where + ": r_offset " + hex(offset) + " does not lie inside a writable PT_LOAD");
      if (offset < dyn_vaddr_ + dyn_size_ && dyn_vaddr_ < offset + 8)
        fail(where + ": r_offset " + hex(offset) + " lies inside the dynamic section");
    }
  }
}

}  // namespace

std::string elf_problem(std::string_view data, uint16_t machine, const std::string& name) {
  if (data.size() < 64 || data.substr(0, 4) != std::string_view("\x7f" "ELF", 4))
    return "not an ELF file (no \\x7fELF magic in a 64-byte header)";
  const auto* h = reinterpret_cast<const unsigned char*>(data.data());
  if (h[4] != 2 || h[5] != 1)
    return "not a 64-bit little-endian ELF file (class " + std::to_string(h[4]) + ", data " + std::to_string(h[5]) + ")";
  const unsigned type = unsigned(h[16]) | unsigned(h[17]) << 8, got = unsigned(h[18]) | unsigned(h[19]) << 8;
  if (type != 3) return "not an ELF shared object (e_type " + std::to_string(type) + ", expected 3, ET_DYN)";
  if (got != machine)
    return "ELF e_machine " + std::to_string(got) + " is not " + name + "'s (" + std::to_string(machine) + ")";
  return "";
}

std::string cpu_code_problem(std::string_view image, uint16_t elf_machine, const std::string& machine,
                             const std::vector<std::string>& entries) {
  try {
    Check(image, elf_machine, machine, entries).run();
  } catch (const Refused& r) {
    return r.why;
  }
  return "";
}

}  // namespace leapp::detail
