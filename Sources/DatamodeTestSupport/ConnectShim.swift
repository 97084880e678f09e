import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A local port that turns every connection into a CONNECT tunnel through the proxy: for clients without a proxy
/// option (nghttp). Python, one thread per direction; stopped with SIGKILL by PID.
public final class ConnectShim: @unchecked Sendable {
    public let port: UInt16
    private let process: Process
    private let output = Pipe()

    public struct Failure: Error, CustomStringConvertible {
        public var description: String
    }

    public init(proxyPort: UInt16, target: String) throws {
        process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["python3", "-u", "-c", Self.script, String(proxyPort), target]
        process.standardOutput = output
        process.standardError = FileHandle.nullDevice
        try process.run()
        let line = String(decoding: output.fileHandleForReading.availableData, as: UTF8.self)
        guard line.hasPrefix("PORT "), let port = UInt16(line.dropFirst(5).trimmingCharacters(in: .whitespacesAndNewlines)) else {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
            throw Failure(description: "the CONNECT shim did not start: \(line)")
        }
        self.port = port
    }

    public func stop() {
        if process.isRunning {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
    }

    deinit { stop() }

    static let script = #"""
import socket, sys, threading
proxy_port, target = int(sys.argv[1]), sys.argv[2]

def pipe(a, b):
    try:
        while True:
            data = a.recv(65536)
            if not data:
                break
            b.sendall(data)
    except OSError:
        pass
    try:
        b.shutdown(socket.SHUT_WR)
    except OSError:
        pass

def serve(client):
    upstream = socket.create_connection(("127.0.0.1", proxy_port))
    upstream.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (target, target)).encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = upstream.recv(1)
        if not chunk:
            client.close()
            return
        head += chunk
    if not head.startswith(b"HTTP/1.1 200"):
        client.close()
        return
    threading.Thread(target=pipe, args=(client, upstream), daemon=True).start()
    pipe(upstream, client)

listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(16)
print("PORT %d" % listener.getsockname()[1], flush=True)
while True:
    conn, _ = listener.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"""#
}
