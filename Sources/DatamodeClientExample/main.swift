// The README's client-kit snippet as a program you can build and run: the WWDC 2019 `adaptiveLoader` pattern
// (ask for the full-size resource without allowing a constrained network; on `.constrained`, fetch the small one)
// through datamode-proxy, with DatamodeClient and Foundation only.
//
//   swift run datamode-client-example FULL-URL LOW-RES-URL [--proxy HOST:PORT]
//   e.g. (the README's demo origin) http://127.0.0.1:8080/video.mp4 http://127.0.0.1:8080/img/poster.jpg
//
// It prints which one it got (`full: N bytes` or `low-res (constrained): N bytes`) and exits 0, or 1 with the error.
import DatamodeClient
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking  // URLSession, URLRequest and URLError live here on Linux (swift-corelibs-foundation)
#endif

var arguments = Array(CommandLine.arguments.dropFirst())
var proxy = "127.0.0.1:8877"
if let flag = arguments.firstIndex(of: "--proxy"), flag + 1 < arguments.count {
    proxy = arguments[flag + 1]
    arguments.removeSubrange(flag...(flag + 1))
}
guard arguments.count == 2, let fullURL = URL(string: arguments[0]), let lowResURL = URL(string: arguments[1]),
      let colon = proxy.lastIndex(of: ":"), let proxyPort = Int(proxy[proxy.index(after: colon)...]) else {
    FileHandle.standardError.write(Data("usage: datamode-client-example FULL-URL LOW-RES-URL [--proxy HOST:PORT]\n".utf8))
    exit(64)
}

let configuration = URLSessionConfiguration.default
DataModeURLProtocol.install(on: configuration, proxyHost: String(proxy[..<colon]), proxyPort: proxyPort)
let session = URLSession(configuration: configuration)

/// One fetch, waited for (a command-line program has no run loop to return to).
func fetch(_ request: URLRequest) -> (Data?, Error?) {
    let done = DispatchSemaphore(value: 0)
    nonisolated(unsafe) var result: (Data?, Error?) = (nil, nil)
    session.dataTask(with: request) { data, _, error in
        result = (data, error)
        done.signal()
    }.resume()
    done.wait()
    return result
}

var request = URLRequest(url: fullURL)
#if canImport(Darwin)
request.allowsConstrainedNetworkAccess = false
#else
request.dataModeAllowsConstrainedNetworkAccess = false  // Linux's Foundation has no allowsConstrainedNetworkAccess
#endif
let (data, error) = fetch(request)
if let error = error as? URLError, let reason = error.dataModeUnavailableReason {
    // Low Data Mode (or an expensive or satellite path): the small one instead.
    let (small, smallError) = fetch(URLRequest(url: lowResURL))
    guard let small else {
        FileHandle.standardError.write(Data("low-res fetch failed: \(smallError.map { "\($0)" } ?? "no data")\n".utf8))
        exit(1)
    }
    print("low-res (\(reason)): \(small.count) bytes")
} else if let data {
    print("full: \(data.count) bytes")
} else {
    FileHandle.standardError.write(Data("fetch failed: \(error.map { "\($0)" } ?? "no data")\n".utf8))
    exit(1)
}
