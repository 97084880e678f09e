import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// What `/proc` says about a process: whether it has exited, resident memory, CPU time, open descriptors
/// (Linux only).
public enum ProcessProbe {
    /// Whether a child has exited. `Process.isRunning` is not reliable here (it can stay true until something
    /// reaps the child), so the kernel's view is read: a zombie (`Z`) or a vanished process.
    public static func hasExited(_ process: Process) -> Bool {
        if !process.isRunning { return true }
        guard let stat = try? String(contentsOfFile: "/proc/\(process.processIdentifier)/stat", encoding: .utf8),
              let close = stat.lastIndex(of: ")") else { return true }
        let state = stat[stat.index(close, offsetBy: 2)...].prefix(1)
        return state == "Z" || state == "X"
    }

    /// `VmRSS` from `/proc/PID/status`, in KiB.
    public static func residentKiB(_ pid: Int32) -> Int? {
        guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
              let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") }) else { return nil }
        return Int(line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first ?? "")
    }

    /// `VmHWM` from `/proc/PID/status` (the peak resident set since start or `resetPeakResident`), in KiB.
    public static func peakResidentKiB(_ pid: Int32) -> Int? {
        guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
              let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmHWM:") }) else { return nil }
        return Int(line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first ?? "")
    }

    /// Starts `VmHWM` again from the current resident set (`clear_refs` 5, proc(5)); false when not allowed.
    @discardableResult
    public static func resetPeakResident(_ pid: Int32) -> Bool {
        guard let handle = FileHandle(forWritingAtPath: "/proc/\(pid)/clear_refs") else { return false }
        defer { try? handle.close() }
        return (try? handle.write(contentsOf: Data("5".utf8))) != nil
    }

    /// utime + stime from `/proc/PID/stat`, in seconds.
    public static func cpuSeconds(_ pid: Int32) -> Double? {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
              let close = stat.lastIndex(of: ")") else { return nil }
        // Fields after "(comm)": state is field 3, utime field 14, stime field 15.
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        guard fields.count > 13, let utime = Double(fields[11]), let stime = Double(fields[12]) else { return nil }
        return (utime + stime) / Double(sysconf(Int32(_SC_CLK_TCK)))
    }

    /// Entries in `/proc/PID/fd`.
    public static func openDescriptorCount(_ pid: Int32) -> Int? {
        (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd"))?.count
    }
}
