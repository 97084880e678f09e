import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// The length of the head at the start of `bytes` (through CRLF CRLF), if it is complete.
func endOfHTTPHead(_ bytes: [UInt8]) -> Int? {
    guard bytes.count >= 4 else { return nil }
    for i in 0...(bytes.count - 4) where bytes[i] == 13 && bytes[i + 1] == 10 && bytes[i + 2] == 13 && bytes[i + 3] == 10 {
        return i + 4
    }
    return nil
}
