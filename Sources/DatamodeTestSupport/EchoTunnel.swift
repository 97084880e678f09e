/// A CONNECT tunnel through a real proxy to a local echo server, already established: what tunnel tests start
/// from. `splice: false` keeps the proxy's evbuffer relay (`DATAMODE_TUNNEL_SPLICE=0`) instead of splice(2).
public final class EchoTunnel {
    public let echo: EchoServer
    public let proxy: ProxyProcess
    public let client: RawHTTPClient

    public struct Failure: Error, CustomStringConvertible {
        public var description: String
    }

    public init(splice: Bool = true) throws {
        echo = try EchoServer()
        do {
            proxy = try ProxyProcess(config: "connect: {ports: [\(echo.port)]}\n",
                                     environment: splice ? [:] : ["DATAMODE_TUNNEL_SPLICE": "0"])
        } catch {
            echo.stop()
            throw error
        }
        client = try RawHTTPClient(port: proxy.port)
        let status = try client.openTunnel(to: "127.0.0.1:\(echo.port)").status
        guard status == 200 else { throw Failure(description: "CONNECT answered \(status)") }
    }

    public func stop() {
        proxy.stop()
        echo.stop()
    }

    deinit { stop() }
}
