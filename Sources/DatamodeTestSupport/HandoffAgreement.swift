import DatamodeHTTP

/// `HeadHandoff`'s two ways with one head, compared: its byte checks (`.unchecked`) and its lengths alone
/// (`.checkedParts`, for heads whose parts are known good), under each of `limits` (limits, largest head). The
/// description of the first disagreement, or nil. (A debug build stops inside `HeadHandoff` first.)
public enum HandoffAgreement {
    public static func disagreement(_ head: RequestHead, under limits: [(HTTPLimits, Int)]) -> String? {
        disagreement(head, limits) { HeadHandoff.request(head, limits: $0, maxHeadBytes: $1, from: $2) }
    }

    public static func disagreement(_ head: ResponseHead, under limits: [(HTTPLimits, Int)]) -> String? {
        disagreement(head, limits) { HeadHandoff.response(head, limits: $0, maxHeadBytes: $1, from: $2) }
    }

    private static func disagreement(_ head: Any, _ limits: [(HTTPLimits, Int)],
                                     _ handoff: (HTTPLimits, Int, HeadHandoff.Source) -> Int?) -> String? {
        for (limits, maxHeadBytes) in limits {
            let checked = handoff(limits, maxHeadBytes, .unchecked)
            let known = handoff(limits, maxHeadBytes, .checkedParts)
            if known != checked { return "\(head): checkedParts \(known as Int?), checked \(checked as Int?)" }
        }
        return nil
    }
}
