import CDatamodeShims
import COpenSSL
#if canImport(Glibc)
import Glibc
#endif

/// Why the local CA cannot be used or made (SPEC §9). The message names the file and says what to do.
public struct CertificateAuthorityError: Error, CustomStringConvertible, Sendable {
    public var description: String
    init(_ description: String) { self.description = description }
}

/// The local certificate authority of HTTPS interception (SPEC §9): an ECDSA P-256 certificate that clients are
/// told to trust, and its key, which signs a leaf for every intercepted host.
///
/// The key is the most sensitive thing the proxy has: anyone who reads it can impersonate every site to every
/// client that trusts the CA. So it is created exclusively (`O_EXCL`: an existing file is never overwritten, a
/// planted symbolic link is never followed), mode 0600 in a 0700 directory, and a key readable by group or others,
/// or owned by another user, is refused at start-up (as `ssh` refuses such a private key). It is never served or
/// logged; only the certificate is (`ca export`, `GET /ca.pem`).
///
/// Leaves share one ECDSA key made here, at start-up (mitmproxy does the same): minting a leaf for a new host
/// then costs one signature, never a key generation on a worker.
public final class CertificateAuthority: @unchecked Sendable {
    /// Where the certificate and key live.
    public let certificatePath: String
    public let keyPath: String
    /// The certificate, PEM: what clients trust.
    public let certificatePEM: String
    /// SHA-256 of the certificate's DER, `AB:CD:…` (what `openssl x509 -fingerprint -sha256` prints).
    public let fingerprint: String
    /// X509*, EVP_PKEY* (CA), EVP_PKEY* (shared by all leaves). Immutable once loaded, so the workers may sign
    /// with them concurrently (OpenSSL 3 keys are safe for concurrent read-only use).
    let certificate: OpaquePointer
    let key: OpaquePointer
    let leafKey: OpaquePointer

    private init(certificatePath: String, keyPath: String, certificate: OpaquePointer, key: OpaquePointer) throws(CertificateAuthorityError) {
        // The EC_KEY-made kind: a leaf then costs one signature, not an encoder run too (see the shim).
        guard let leafKey = dm_ec_p256_leaf_keygen() else {
            X509_free(certificate)
            EVP_PKEY_free(key)
            throw CertificateAuthorityError("cannot generate the leaf key: \(TLSClientContext.lastError())")
        }
        self.certificatePath = certificatePath
        self.keyPath = keyPath
        self.certificate = certificate
        self.key = key
        self.leafKey = leafKey
        certificatePEM = Self.pem(certificate)
        fingerprint = Self.fingerprint(certificate)
    }

    deinit {
        X509_free(certificate)
        EVP_PKEY_free(key)
        EVP_PKEY_free(leafKey)
    }

    // MARK: loading

    /// Whether a CA is present: its certificate or its key exists (a half-present CA is an error, not absent).
    public static func exists(certificatePath: String, keyPath: String) -> Bool {
        var info = stat()
        return lstat(certificatePath, &info) == 0 || lstat(keyPath, &info) == 0
    }

    /// Loads an existing CA, checking the key file's owner and mode first.
    public static func load(certificatePath: String, keyPath: String) throws(CertificateAuthorityError) -> CertificateAuthority {
        try checkKeyFile(keyPath)
        let keyText = try readFile(keyPath, what: "CA key")
        let certificateText = try readFile(certificatePath, what: "CA certificate")
        guard let key = keyText.withBIO({ PEM_read_bio_PrivateKey($0, nil, nil, nil) }) else {
            throw CertificateAuthorityError("\(keyPath): not a PEM private key (\(TLSClientContext.lastError()))")
        }
        guard let certificate = certificateText.withBIO({ PEM_read_bio_X509($0, nil, nil, nil) }) else {
            EVP_PKEY_free(key)
            throw CertificateAuthorityError("\(certificatePath): not a PEM certificate (\(TLSClientContext.lastError()))")
        }
        guard X509_check_private_key(certificate, key) == 1 else {
            X509_free(certificate)
            EVP_PKEY_free(key)
            throw CertificateAuthorityError("\(keyPath) is not the key of \(certificatePath)")
        }
        return try CertificateAuthority(certificatePath: certificatePath, keyPath: keyPath, certificate: certificate, key: key)
    }

    /// The key file must be a regular file of this user, unreadable by group and others (SPEC §9).
    static func checkKeyFile(_ path: String) throws(CertificateAuthorityError) {
        var info = stat()
        guard lstat(path, &info) == 0 else {
            throw CertificateAuthorityError("\(path): \(String(cString: strerror(errno))); create a CA with `datamode-proxy ca init`")
        }
        guard (info.st_mode & S_IFMT) == S_IFREG else {
            throw CertificateAuthorityError("\(path): the CA key must be a regular file (not a link or a device)")
        }
        guard info.st_uid == geteuid() else {
            throw CertificateAuthorityError("\(path): the CA key is owned by uid \(info.st_uid), not by this user (uid \(geteuid())); refusing it")
        }
        guard info.st_mode & 0o077 == 0 else {
            throw CertificateAuthorityError("\(path): the CA key is readable by group or others (mode \(String(info.st_mode & 0o777, radix: 8))); "
                + "run `chmod 600 \(path)`")
        }
    }

    private static func readFile(_ path: String, what: String) throws(CertificateAuthorityError) -> [UInt8] {
        let fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC)
        guard fd >= 0 else { throw CertificateAuthorityError("\(path): cannot read the \(what): \(String(cString: strerror(errno)))") }
        defer { Glibc.close(fd) }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 16384)
        while true {
            let n = read(fd, &chunk, chunk.count)
            if n < 0 { throw CertificateAuthorityError("\(path): cannot read the \(what): \(String(cString: strerror(errno)))") }
            if n == 0 { break }
            bytes += chunk[0..<n]
            if bytes.count > 1 << 20 { throw CertificateAuthorityError("\(path): the \(what) is larger than 1 MiB") }
        }
        return bytes
    }

    /// The certificate at `path` (PEM) and its SHA-256 fingerprint, without touching the key (`ca export`).
    public static func certificateOnly(path: String) throws(CertificateAuthorityError) -> (pem: String, fingerprint: String) {
        let text: [UInt8]
        do {
            text = try readFile(path, what: "CA certificate")
        } catch {
            throw CertificateAuthorityError(error.description + "; create a CA with `datamode-proxy ca init`")
        }
        guard let certificate = text.withBIO({ PEM_read_bio_X509($0, nil, nil, nil) }) else {
            throw CertificateAuthorityError("\(path): not a PEM certificate; create a CA with `datamode-proxy ca init`")
        }
        defer { X509_free(certificate) }
        return (pem(certificate), fingerprint(certificate))
    }

    // MARK: creating

    /// Creates a new CA. Without `replace`, an existing certificate or key is an error and nothing is written;
    /// with it (`ca init --force`) both are replaced by renaming new files over them. The key is written first,
    /// exclusively, 0600; the directory is created 0700 when missing.
    public static func create(certificatePath: String, keyPath: String, replace: Bool = false,
                              commonName: String = "datamode-proxy CA") throws(CertificateAuthorityError) -> CertificateAuthority {
        if !replace && exists(certificatePath: certificatePath, keyPath: keyPath) {
            throw CertificateAuthorityError("a CA already exists (\(certificatePath), \(keyPath)); "
                + "`datamode-proxy ca init --force` replaces it (every client must then trust the new one)")
        }
        for path in Set([directory(of: certificatePath), directory(of: keyPath)]) { try makeDirectory(path) }
        try restrictKeyDirectory(directory(of: keyPath))
        guard let key = dm_ec_p256_keygen() else {
            throw CertificateAuthorityError("cannot generate the CA key: \(TLSClientContext.lastError())")
        }
        guard let certificate = try? selfSigned(key: key, commonName: commonName) else {
            EVP_PKEY_free(key)
            throw CertificateAuthorityError("cannot make the CA certificate: \(TLSClientContext.lastError())")
        }
        let keyPEM = pem(privateKey: key)
        let certificatePEM = pem(certificate)
        do throws(CertificateAuthorityError) {
            if replace {
                try writeReplacing(keyPath, Array(keyPEM.utf8), mode: 0o600)
                try writeReplacing(certificatePath, Array(certificatePEM.utf8), mode: 0o644)
            } else {
                try writeExclusive(keyPath, Array(keyPEM.utf8), mode: 0o600)
                do throws(CertificateAuthorityError) {
                    try writeExclusive(certificatePath, Array(certificatePEM.utf8), mode: 0o644)
                } catch {
                    unlink(keyPath)
                    throw error
                }
            }
        } catch {
            X509_free(certificate)
            EVP_PKEY_free(key)
            throw error
        }
        return try CertificateAuthority(certificatePath: certificatePath, keyPath: keyPath, certificate: certificate, key: key)
    }

    static func directory(of path: String) -> String {
        guard let slash = path.lastIndex(of: "/") else { return "." }
        return slash == path.startIndex ? "/" : String(path[..<slash])
    }

    /// Creates `path` (and its parents) with mode 0700 when missing.
    private static func makeDirectory(_ path: String) throws(CertificateAuthorityError) {
        var info = stat()
        if stat(path, &info) == 0 {
            guard (info.st_mode & S_IFMT) == S_IFDIR else { throw CertificateAuthorityError("\(path) is not a directory") }
            return
        }
        let parent = directory(of: path)
        if parent != path && parent != "." && parent != "/" { try makeDirectory(parent) }
        guard mkdir(path, 0o700) == 0 || errno == EEXIST else {
            throw CertificateAuthorityError("cannot create \(path): \(String(cString: strerror(errno)))")
        }
    }

    /// The key's directory is 0700 (SPEC §9), so that no other user can even list it or swap the key under it. A
    /// directory of ours that is more open (a state directory made by an older version) is tightened; another
    /// user's is refused.
    private static func restrictKeyDirectory(_ path: String) throws(CertificateAuthorityError) {
        var info = stat()
        guard stat(path, &info) == 0 else { throw CertificateAuthorityError("cannot use \(path): \(String(cString: strerror(errno)))") }
        guard info.st_mode & 0o077 != 0 else { return }
        guard info.st_uid == geteuid(), chmod(path, 0o700) == 0 else {
            throw CertificateAuthorityError("\(path) is open to other users (mode \(String(info.st_mode & 0o777, radix: 8))) and cannot "
                + "be restricted to 0700; choose another place for the CA key (tls.ca.key)")
        }
    }

    /// O_CREAT|O_EXCL|O_NOFOLLOW: fails if anything (a file, a dangling link) is already there.
    private static func writeExclusive(_ path: String, _ bytes: [UInt8], mode: mode_t) throws(CertificateAuthorityError) {
        let fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode)
        guard fd >= 0 else {
            throw CertificateAuthorityError("cannot create \(path): \(String(cString: strerror(errno)))")
        }
        defer { Glibc.close(fd) }
        // The umask may have removed bits, never added any; set exactly what is meant.
        fchmod(fd, mode)
        var offset = 0
        while offset < bytes.count {
            let n = bytes[offset...].withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
            guard n > 0 else {
                unlink(path)
                throw CertificateAuthorityError("cannot write \(path): \(String(cString: strerror(errno)))")
            }
            offset += n
        }
        guard fsync(fd) == 0 else { throw CertificateAuthorityError("cannot write \(path): \(String(cString: strerror(errno)))") }
    }

    /// A new file beside `path`, written exclusively, then renamed over it: a crash leaves the old or the new one.
    private static func writeReplacing(_ path: String, _ bytes: [UInt8], mode: mode_t) throws(CertificateAuthorityError) {
        let temporary = path + ".new-\(getpid())"
        unlink(temporary)
        try writeExclusive(temporary, bytes, mode: mode)
        guard rename(temporary, path) == 0 else {
            unlink(temporary)
            throw CertificateAuthorityError("cannot replace \(path): \(String(cString: strerror(errno)))")
        }
    }

    private struct Failure: Error {}

    /// The CA certificate: basicConstraints critical CA:TRUE pathlen:0, keyUsage critical keyCertSign+cRLSign,
    /// subject key identifier; valid from an hour ago for 10 years.
    private static func selfSigned(key: OpaquePointer, commonName: String) throws(Failure) -> OpaquePointer {
        guard let certificate = X509_new() else { throw Failure() }
        var ok = X509_set_version(certificate, 2) == 1
        ok = ok && setRandomSerial(certificate)
        let name = X509_NAME_new()
        ok = ok && X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC, "datamode-proxy", -1, -1, 0) == 1
        ok = ok && X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, commonName, -1, -1, 0) == 1
        ok = ok && X509_set_subject_name(certificate, name) == 1 && X509_set_issuer_name(certificate, name) == 1
        X509_NAME_free(name)
        ok = ok && X509_gmtime_adj(X509_getm_notBefore(certificate), -3600) != nil
        ok = ok && X509_gmtime_adj(X509_getm_notAfter(certificate), 10 * 365 * 86400) != nil
        ok = ok && X509_set_pubkey(certificate, key) == 1
        ok = ok && addExtensions(certificate, issuer: certificate, [
            (NID_basic_constraints, "critical,CA:TRUE,pathlen:0"),
            (NID_key_usage, "critical,keyCertSign,cRLSign"),
            (NID_subject_key_identifier, "hash"),
        ])
        ok = ok && X509_sign(certificate, key, EVP_sha256()) > 0
        guard ok else {
            X509_free(certificate)
            throw Failure()
        }
        return certificate
    }

    // MARK: leaves

    /// A leaf for `host` (a DNS name, or an IP literal without brackets): subjectAltName, serverAuth, CA:FALSE,
    /// authority and subject key identifiers, valid from an hour ago (clocks that lag) for 397 days at most
    /// (the CA/Browser Forum limit Chromium and Safari enforce). `nil` for a name that cannot be a host.
    /// Returns the X509* (the caller frees it) and when it stops being valid (seconds since the epoch).
    func mintLeaf(for host: String, now: Int64) -> (certificate: OpaquePointer, notAfter: Int64)? {
        let isIP = SocketAddress(ipLiteral: host, port: 0) != nil
        guard isIP || Self.isHostName(host) else { return nil }
        guard let leaf = X509_new() else { return nil }
        var ok = X509_set_version(leaf, 2) == 1
        ok = ok && Self.setRandomSerial(leaf)
        let name = X509_NAME_new()
        ok = ok && X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC, "datamode-proxy", -1, -1, 0) == 1
        // A CN holds at most 64 characters (RFC 5280 ub-common-name); clients read the subjectAltName anyway.
        if host.utf8.count <= 64 { ok = ok && X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, host, -1, -1, 0) == 1 }
        ok = ok && X509_set_subject_name(leaf, name) == 1
        X509_NAME_free(name)
        ok = ok && X509_set_issuer_name(leaf, X509_get_subject_name(certificate)) == 1
        let notBefore = now - 3600
        let notAfter = notBefore + Self.leafValiditySeconds
        ok = ok && ASN1_TIME_set(X509_getm_notBefore(leaf), time_t(notBefore)) != nil
        ok = ok && ASN1_TIME_set(X509_getm_notAfter(leaf), time_t(notAfter)) != nil
        ok = ok && X509_set_pubkey(leaf, leafKey) == 1
        ok = ok && Self.addExtensions(leaf, issuer: certificate, [
            (NID_basic_constraints, "critical,CA:FALSE"),
            (NID_key_usage, "critical,digitalSignature"),
            (NID_ext_key_usage, "serverAuth"),
            (NID_subject_key_identifier, "hash"),
            (NID_authority_key_identifier, "keyid:always"),
            (NID_subject_alt_name, (isIP ? "IP:" : "DNS:") + host),
        ])
        ok = ok && X509_sign(leaf, key, EVP_sha256()) > 0
        guard ok else {
            X509_free(leaf)
            return nil
        }
        return (leaf, notAfter)
    }

    /// 397 days: the longest validity browsers accept for a TLS server certificate.
    static let leafValiditySeconds: Int64 = 397 * 86400

    /// Letters, digits, `-`, `_`, dots; 1…253 characters, labels of 1…63. Only such names reach the
    /// subjectAltName (its configuration syntax would read a comma as a second entry).
    static func isHostName(_ host: String) -> Bool {
        let bytes = Array(host.utf8)
        guard !bytes.isEmpty, bytes.count <= 253 else { return false }
        var label = 0
        for byte in bytes {
            switch byte {
            case UInt8(ascii: "."):
                guard label > 0 else { return false }
                label = 0
            case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
                 UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "_"):
                label += 1
                guard label <= 63 else { return false }
            default:
                return false
            }
        }
        return true
    }

    private static func setRandomSerial(_ certificate: OpaquePointer) -> Bool {
        var bytes = [UInt8](repeating: 0, count: 16)
        guard RAND_bytes(&bytes, Int32(bytes.count)) == 1 else { return false }
        bytes[0] &= 0x7F  // positive (RFC 5280 §4.1.2.2)
        bytes[0] |= 0x01  // and 16 bytes long
        guard let number = BN_bin2bn(bytes, Int32(bytes.count), nil) else { return false }
        defer { BN_free(number) }
        return BN_to_ASN1_INTEGER(number, X509_get_serialNumber(certificate)) != nil
    }

    private static func addExtensions(_ certificate: OpaquePointer, issuer: OpaquePointer,
                                      _ extensions: [(Int32, String)]) -> Bool {
        var context = X509V3_CTX()
        X509V3_set_ctx(&context, issuer, certificate, nil, nil, 0)
        for (nid, value) in extensions {
            guard let ext = X509V3_EXT_conf_nid(nil, &context, nid, value) else { return false }
            defer { X509_EXTENSION_free(ext) }
            guard X509_add_ext(certificate, ext, -1) == 1 else { return false }
        }
        return true
    }

    // MARK: encodings

    static func pem(_ certificate: OpaquePointer) -> String {
        withMemoryBIO { PEM_write_bio_X509($0, certificate) }
    }

    static func pem(privateKey: OpaquePointer) -> String {
        withMemoryBIO { PEM_write_bio_PrivateKey($0, privateKey, nil, nil, 0, nil, nil) }
    }

    private static func withMemoryBIO(_ write: (OpaquePointer?) -> Int32) -> String {
        guard let bio = BIO_new(BIO_s_mem()) else { return "" }
        defer { BIO_free(bio) }
        guard write(bio) == 1 else { return "" }
        let length = Int(BIO_ctrl_pending(bio))
        var bytes = [UInt8](repeating: 0, count: length)
        let n = BIO_read(bio, &bytes, Int32(length))
        return String(decoding: bytes.prefix(max(0, Int(n))), as: UTF8.self)
    }

    static func fingerprint(_ certificate: OpaquePointer) -> String {
        var digest = [UInt8](repeating: 0, count: Int(EVP_MAX_MD_SIZE))
        var length: UInt32 = 0
        guard X509_digest(certificate, EVP_sha256(), &digest, &length) == 1 else { return "" }
        let hex = Array("0123456789ABCDEF".utf8)
        return digest.prefix(Int(length)).map { String(decoding: [hex[Int($0 >> 4)], hex[Int($0 & 15)]], as: UTF8.self) }
            .joined(separator: ":")
    }
}

private extension Array where Element == UInt8 {
    /// Runs `body` with a read-only memory BIO over these bytes.
    func withBIO<T>(_ body: (OpaquePointer?) -> T?) -> T? {
        withUnsafeBytes { raw -> T? in
            guard let bio = BIO_new_mem_buf(raw.baseAddress, Int32(raw.count)) else { return nil }
            defer { BIO_free(bio) }
            return body(bio)
        }
    }
}
