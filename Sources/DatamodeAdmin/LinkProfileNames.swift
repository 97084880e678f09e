/// The link profile names of SPEC §10 that a session may name. The shaping itself (and profiles defined in the
/// configuration) belongs to the link-conditions code, which replaces `AdminAPI.knownProfiles` with its own list.
public enum LinkProfileNames {
    public static let builtIn: Set<String> = [
        "devtools-3g", "devtools-slow-4g", "devtools-fast-4g", "nlc-3g", "nlc-dsl", "nlc-lte", "nlc-very-bad-network",
        "geo-satellite",
    ]
}
